//! Background work on the bucket and the metadata: checkpoints, garbage collection,
//! compaction and the packer (recent history out of the WAL, from memory), and the scheduler every periodic pass of the node runs under
//! (these, and the stream service's retention and dormancy passes, and the fence
//! watch). Nothing here serves a request.

pub mod checkpoint;
pub mod compaction;
pub mod gc;
pub mod packer;
pub mod scheduler;

pub use scheduler::{Every, Scheduler};
