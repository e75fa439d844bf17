//! Python stacks read from outside: each thread's frame chain walked, leaf
//! first, over a snapshot of the frames its previous walks met, each frame
//! checked as it is read (running, a code object), and code objects cached
//! (invalidated when an address is reused). The reasons behind each rule
//! are in docs/design/python-walk.md.

mod cframes;
mod chain;
mod code;
mod frame;
pub mod line_table;
mod memory;
mod read;
mod snapshot;

pub use chain::{End, MAX_DEPTH};
pub use code::CodeCache;
pub use read::{read_copied, read_stack, Stack, Walks, TRUNCATED};
