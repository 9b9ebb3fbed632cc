//! The staging engine's plan and hand-off: tensors packed into slab-sized
//! batches (`layout`), and which batches are final and which slabs may be
//! written (`ready`). `session::Staging` runs it: one executor reads into
//! a few slabs several batches ahead while the copy side (the Python
//! binding: host or CUDA copies) takes each final batch out and gives its
//! slab back. Destinations that the reads cannot write directly (device
//! memory, another dtype, non-contiguous views) go this way; the copies
//! into host memory, casts included, are made here (`host`, `cast`).

mod cast;
mod host;
mod layout;
mod ready;

pub use cast::Float;
pub use host::{Conv, HostDests, HostItem};
pub use layout::{
    data_slot, header_slot, layout, ops, piece_of_slot, wants, Batch, BatchOps, ByteOp, Extent,
    ItemOp, ItemSpec, Layout, Piece, Run, Target, ALIGN, CHUNK, UNIT,
};
pub use ready::Ready;
