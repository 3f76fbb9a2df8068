//! The `picomq` command line: `serve` (flags onto a node's configuration, logging,
//! signals), the client commands, `store` (a store's identity, `identity`), and the
//! TOML configuration file. A library so that tests start nodes from the very flags
//! users type.

pub mod cli;
pub mod config_file;
pub mod identity;
pub mod logging;
pub mod serve;
pub mod storage;
