//! The commands' bodies: each reads what it needs of the configuration, does its work (serves,
//! asks a server, runs a simulation), prints, and ends with the command's exit code.

mod acquire;
mod limits;
mod serve;
mod simulate;
mod status;
mod tokens;

pub(crate) use acquire::acquire;
pub(crate) use limits::{check_limits, limits};
pub(crate) use serve::serve;
pub(crate) use simulate::simulate;
pub(crate) use status::status;
pub(crate) use tokens::tokens;
