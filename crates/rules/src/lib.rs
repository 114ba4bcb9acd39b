//! Limit rules: validation, matching, path normalisation, the rules sources and their reload.
//!
//! A rule is a [`tollgate::Limit`] plus an optional request [`Match`]. Rules are validated in
//! two stages ([`RawRule`] as written, then [`Rule`]), stored in one SQL table that
//! administrators may edit by hand ([`SqlSource`]) or in a TOML or YAML file kept under review
//! ([`FileSource`]), and put in force as one snapshot on the limiter ([`Rules`]), reloaded on a
//! poll and, on PostgreSQL, on notification.

mod fanout;
mod file;
mod inbound;
mod path;
mod reload;
mod rule;
mod sql;

pub use fanout::check_fanout;
pub use file::{EntryLines, FILE_BYTES_MAX, FileFormat, FileSource, parse_limits, render_limits};
pub use inbound::{Ask, InboundIndex, Matched, Positions};
pub use path::{
    MATCH_METHOD_BYTES_MAX, MATCH_PATH_BYTES_MAX, Match, PathCase, PathError, PathMatching,
    PathParams, decoded_separators, method_matches, normalize_path,
};
pub use reload::{RULES_MAX, RejectedRow, RuleSet, Rules, RulesError, RulesSource, RulesStats};
pub use rule::{RawMatch, RawReserve, RawRule, Rule, RuleError, Validate, serde_field};
pub use sql::{
    COLUMNS, ChangeFeed, DEFAULT_TABLE, PreviousRun, SourceError, SqlSource, TABLE_NAME_BYTES_MAX,
    TableRow, TokenRow, check_table_name, column_of, redact,
};
