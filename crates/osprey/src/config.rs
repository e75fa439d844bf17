//! (in progress)
pub struct Config;
