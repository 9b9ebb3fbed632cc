//! fastshard: model weights (tensorizer `.tensors` and safetensors files) from
//! storage (local files, S3, HTTP(S), Google Cloud Storage) into memory, fast.
//!
//! The data path: a [`io::RangeSource`] gives bytes, [`format`] parses the
//! header and index, [`plan`] decides which byte ranges to fetch and where each
//! byte goes, [`exec`] fetches them concurrently into destination memory, and
//! [`session`] ties these together for one opened file. The `py` module (only
//! with the `python` feature) is the sole place that knows about Python.
//!
//! Layers, each using only those below it: `py` → the facades [`session`],
//! [`save`] and [`objects`] (the only code that blocks on the runtime) →
//! [`stage`] (a staged load's batches and their hand-off) →
//! [`exec`] → [`io`] (async only) → [`buffer`] → [`plan`] → `format` →
//! [`error`]; [`location`] (a URI parsed once), [`cancel`] and [`fork`]
//! (per-process state) sit at the bottom beside `error`.

pub mod buffer;
pub mod cancel;
pub mod error;
pub mod exec;
pub mod fork;
pub mod format;
pub mod io;
pub mod location;
pub mod objects;
pub mod plan;
pub mod save;
pub mod session;
pub mod stage;

#[cfg(feature = "python")]
mod py;

pub use cancel::CancelToken;
pub use error::{Error, ErrorKind, Reason, Result};
pub use location::{Kind, Location};
