//! Limits as code: a TOML or YAML file of limits, kept under review beside the code that uses
//! them, as a read-only rules source. This module owns the file format (a `limits` table of
//! rules by name, each with the admin API's fields), reading it without catching an editor
//! half-way through a write, and writing one from the rules in force (`tollgate limits export`).
//!
//! ```toml
//! [limits.vendor-x]
//! kind = "rate"
//! limit = 600
//! period_ms = 60000
//! ```
//!
//! A file that does not parse is refused whole, and the rules in force stay as they are; an
//! entry that parses but is not a valid rule is rejected alone, as a bad row of the SQL table is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Mutex;

use crate::rule::{RawRule, RuleError};
use crate::sql::{SourceError, TableRow};

/// How long a changed file must stay the same before it is read as the new truth: an editor
/// that truncates and then writes leaves a prefix of the file for a moment.
const SETTLE: Duration = Duration::from_millis(50);
/// Largest limits file read, in bytes; a bigger one is refused, not read into memory.
pub const FILE_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// The two spellings of a limits file, told apart by the file's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileFormat {
    Toml,
    Yaml,
}

impl FileFormat {
    /// `.toml`, or `.yaml`/`.yml`.
    pub fn of_path(path: &Path) -> Result<FileFormat, String> {
        match path.extension().and_then(|extension| extension.to_str()) {
            Some("toml") => Ok(FileFormat::Toml),
            Some("yaml" | "yml") => Ok(FileFormat::Yaml),
            _ => Err("must end in .toml, .yaml or .yml".to_owned()),
        }
    }

    /// `toml` or `yaml`.
    pub fn parse(text: &str) -> Result<FileFormat, String> {
        match text {
            "toml" => Ok(FileFormat::Toml),
            "yaml" | "yml" => Ok(FileFormat::Yaml),
            other => Err(format!("{other:?} is not a format: use toml or yaml")),
        }
    }
}

/// The file's shape: one table, `limits`, of rules by name. Unknown top-level keys are refused,
/// so a misspelt `limit` table is an error rather than a file with no limits.
#[derive(serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile<T> {
    limits: Entries<T>,
}

/// Entries by name that refuse a name given twice (YAML allows it; a second entry would
/// silently win).
struct Entries<T>(BTreeMap<String, T>);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Entries<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = Entries<T>;
            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a table of limits by name")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut entries = BTreeMap::new();
                while let Some(name) = map.next_key::<String>()? {
                    if entries.contains_key(&name) {
                        return Err(serde::de::Error::custom(format!(
                            "limit {name:?} is defined twice"
                        )));
                    }
                    let entry = map.next_value()?;
                    entries.insert(name, entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(Visit(std::marker::PhantomData))
    }
}

impl<T: Serialize> Serialize for Entries<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// Read a limits file's text into one row per limit, in name order. An error here is the whole
/// file's (bad syntax, no `limits` table, a name given twice) and says where; an entry that is
/// not a rule comes back as that row's error, naming its field. Every row says its lines.
pub fn parse_limits(text: &str, format: FileFormat) -> Result<Vec<TableRow>, String> {
    // Entries are kept as untyped values first, so one bad entry does not refuse the others.
    // TOML gives each entry's span; YAML's parser gives none, so its entries are found by key.
    let entries: Vec<(String, serde_json::Value, std::ops::Range<usize>)> = match format {
        FileFormat::Toml => {
            let file: LimitsFile<toml::Spanned<serde_json::Value>> =
                toml::from_str(text).map_err(|error| error.to_string())?;
            file.limits
                .0
                .into_iter()
                .map(|(name, entry)| {
                    // A `[limits.NAME]` table's span is its header: its fields follow, up to
                    // the next header.
                    let span = entry.span();
                    let end = text
                        .get(span.end..)
                        .and_then(|rest| rest.find("\n["))
                        .map_or(text.len(), |header| span.end + header + 1);
                    (name, entry.into_inner(), span.start..end)
                })
                .collect()
        }
        FileFormat::Yaml => {
            let file: LimitsFile<serde_json::Value> =
                yaml_serde::from_str(text).map_err(|error| error.to_string())?;
            file.limits
                .0
                .into_iter()
                .map(|(name, entry)| {
                    let span = yaml_entry_span(text, &name);
                    (name, entry, span)
                })
                .collect()
        }
    };
    Ok(entries
        .into_iter()
        .map(|(name, entry, span)| {
            let separator = match format {
                FileFormat::Toml => '=',
                FileFormat::Yaml => ':',
            };
            let fields = entry.as_object().map_or_else(Vec::new, |fields| {
                fields
                    .keys()
                    .filter_map(|field| {
                        let at = find_key(text, span.clone(), field, separator)?;
                        Some((field.clone(), line_at(text, at)))
                    })
                    .collect()
            });
            TableRow {
                lines: Some(EntryLines {
                    entry: line_at(text, span.start),
                    fields,
                }),
                rule: entry_rule(entry),
                name,
            }
        })
        .collect())
}

/// Where a file writes an entry, so a fault is reported at its line: the entry's first line,
/// and the line of each of its top-level fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EntryLines {
    pub entry: u32,
    pub fields: Vec<(String, u32)>,
}

impl EntryLines {
    /// The line of `field` (a nested `reserve.high` is reported at its `reserve`), else the
    /// entry's.
    pub fn of(&self, field: &str) -> u32 {
        let top = field.split(['.', '[']).next().unwrap_or(field);
        self.fields
            .iter()
            .find(|(name, _)| name == top)
            .map_or(self.entry, |(_, line)| *line)
    }
}

/// The 1-based line holding byte `at` of `text`.
fn line_at(text: &str, at: usize) -> u32 {
    let before = text.get(..at).unwrap_or(text);
    u32::try_from(before.matches('\n').count() + 1).unwrap_or(u32::MAX)
}

/// Where `key` is written as a key within `range` of `text`: plain or quoted, first on its
/// line or after `{` or `,`, and followed by `separator`. The first such place, if any.
fn find_key(
    text: &str,
    range: std::ops::Range<usize>,
    key: &str,
    separator: char,
) -> Option<usize> {
    let within = text.get(range.clone())?;
    [key.to_owned(), format!("\"{key}\""), format!("'{key}'")]
        .iter()
        .flat_map(|spelling| {
            within
                .match_indices(spelling.as_str())
                .filter_map(move |(at, _)| {
                    let before = within[..at].trim_end_matches([' ', '\t']);
                    let after = within[at + spelling.len()..].trim_start_matches([' ', '\t']);
                    let starts = before.is_empty() || before.ends_with(['\n', '{', ',']);
                    (starts && after.starts_with(separator)).then_some(range.start + at)
                })
        })
        .min()
}

/// The bytes of a YAML file that hold the entry `name` of its `limits` mapping: from its key
/// to the next line indented no deeper than the key (a flow entry is its own line).
fn yaml_entry_span(text: &str, name: &str) -> std::ops::Range<usize> {
    let limits = find_key(text, 0..text.len(), "limits", ':').unwrap_or(0);
    let Some(start) = find_key(text, limits..text.len(), name, ':') else {
        return limits..text.len();
    };
    let line_start = text[..start].rfind('\n').map_or(0, |newline| newline + 1);
    let column = start - line_start;
    let mut end = text.len();
    let mut offset = text[start..]
        .find('\n')
        .map_or(text.len(), |newline| start + newline + 1);
    while offset < text.len() {
        let line = text[offset..].split('\n').next().unwrap_or("");
        let content = line.trim_start_matches(' ');
        if !content.trim().is_empty()
            && !content.starts_with('#')
            && line.len() - content.len() <= column
        {
            end = offset;
            break;
        }
        offset += line.len() + 1;
    }
    start..end
}

fn entry_rule(entry: serde_json::Value) -> Result<RawRule, RuleError> {
    serde_path_to_error::deserialize(entry).map_err(|error| {
        let path = error.path().to_string();
        let message = error.into_inner().to_string();
        let field = crate::rule::serde_field(&path, &message, "limit entry");
        RuleError {
            field: field.into(),
            reason: message,
        }
    })
}

/// A limits file holding `rules` (canonical forms, by name), as `tollgate limits export`
/// writes it; reading it back gives the same rules.
pub fn render_limits<'r>(
    rules: impl IntoIterator<Item = &'r RawRule>,
    format: FileFormat,
) -> Result<String, String> {
    let limits = rules
        .into_iter()
        .filter_map(|rule| {
            let name = rule.name.clone()?;
            let mut entry = rule.clone();
            entry.name = None;
            Some((name, entry))
        })
        .collect();
    let file = LimitsFile {
        limits: Entries(limits),
    };
    match format {
        FileFormat::Toml => toml::to_string(&file).map_err(|error| error.to_string()),
        FileFormat::Yaml => yaml_serde::to_string(&file).map_err(|error| error.to_string()),
    }
}

/// A limits file as a rules source: read on every reload, never written.
#[derive(Debug)]
pub struct FileSource {
    path: PathBuf,
    format: FileFormat,
    /// The text last read in full, to tell a settled file from one being written.
    settled: Mutex<Option<String>>,
}

impl FileSource {
    /// `file://PATH` (a relative path is relative to the working directory), ending in `.toml`,
    /// `.yaml` or `.yml`. The file is read at the first load, not here.
    pub fn open(url: &str) -> Result<FileSource, SourceError> {
        let path = url
            .strip_prefix("file://")
            .filter(|path| !path.is_empty())
            .ok_or_else(|| SourceError::BadUrl {
                url: url.to_owned(),
                reason: "must be file://PATH".to_owned(),
            })?;
        FileSource::new(PathBuf::from(path))
    }

    /// The limits file at `path`, ending in `.toml`, `.yaml` or `.yml`.
    pub fn new(path: PathBuf) -> Result<FileSource, SourceError> {
        let format = FileFormat::of_path(&path).map_err(|reason| SourceError::File {
            path: path.display().to_string(),
            reason,
        })?;
        Ok(FileSource {
            path,
            format,
            settled: Mutex::new(None),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn format(&self) -> FileFormat {
        self.format
    }

    /// Whether the file is there to be read, for readiness: what is in force stays in force
    /// while its authors edit it, so a file that does not parse now is still ready.
    pub async fn ping(&self) -> Result<(), SourceError> {
        tokio::fs::metadata(&self.path)
            .await
            .map(|_| ())
            .map_err(|error| self.error(error.to_string()))
    }

    fn error(&self, reason: impl Into<String>) -> SourceError {
        SourceError::File {
            path: self.path.display().to_string(),
            reason: reason.into(),
        }
    }

    async fn read(&self) -> Result<String, SourceError> {
        let length = tokio::fs::metadata(&self.path)
            .await
            .map_err(|error| self.error(error.to_string()))?
            .len();
        if length > FILE_BYTES_MAX {
            return Err(self.error(format!(
                "is {length} bytes; a limits file may be at most {FILE_BYTES_MAX}"
            )));
        }
        let bytes = tokio::fs::read(&self.path)
            .await
            .map_err(|error| self.error(error.to_string()))?;
        String::from_utf8(bytes).map_err(|_| self.error("is not UTF-8 text"))
    }

    /// Every limit of the file, in name order. A file that changed since the last load is read
    /// again a moment later, and taken only if it reads the same.
    pub async fn load(&self) -> Result<Vec<TableRow>, SourceError> {
        let mut settled = self.settled.lock().await;
        let mut text = self.read().await?;
        if settled.as_deref() != Some(text.as_str()) {
            tokio::time::sleep(SETTLE).await;
            let again = self.read().await?;
            if again != text {
                return Err(self.error("is being written; it is read again at the next reload"));
            }
            text = again;
        }
        let rows = parse_limits(&text, self.format).map_err(|reason| self.error(reason))?;
        *settled = Some(text);
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(text: &str, format: FileFormat) -> Vec<(String, Result<RawRule, RuleError>)> {
        parse_limits(text, format)
            .expect("parses")
            .into_iter()
            .map(|row| (row.name, row.rule))
            .collect()
    }

    #[test]
    fn toml_and_yaml_spell_the_same_limits() {
        let toml = r#"
            [limits.vendor-x]
            kind = "rate"
            limit = 600
            period_ms = 60000
            reserve = { high = 100 }

            [limits.exports]
            kind = "concurrency"
            limit = 4
            lease_ttl_ms = 30000
        "#;
        let yaml = "
limits:
  vendor-x:
    kind: rate
    limit: 600
    period_ms: 60000
    reserve: {high: 100}
  exports:
    kind: concurrency
    limit: 4
    lease_ttl_ms: 30000
";
        let from_toml = rows(toml, FileFormat::Toml);
        assert_eq!(from_toml, rows(yaml, FileFormat::Yaml));
        let names: Vec<&str> = from_toml.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["exports", "vendor-x"]);
        let vendor = from_toml[1].1.as_ref().expect("a rule");
        assert_eq!(vendor.limit, Some(600));
        assert_eq!(vendor.reserve.as_ref().and_then(|r| r.high), Some(100));
    }

    #[test]
    fn a_bad_entry_is_refused_alone_naming_its_field() {
        let text = r#"
            [limits.good]
            kind = "rate"
            limit = 5
            period_ms = 1000

            [limits.typo]
            kind = "rate"
            limt = 5

            [limits.wrong-type]
            kind = "rate"
            limit = "five"

            [limits.nested]
            kind = "rate"
            reserve = { hihg = 1 }
        "#;
        let rows = rows(text, FileFormat::Toml);
        let error = |name: &str| {
            rows.iter()
                .find(|(row, _)| row == name)
                .and_then(|(_, rule)| rule.clone().err())
                .expect("refused")
        };
        assert!(rows[0].1.is_ok(), "{:?}", rows[0]);
        assert_eq!(error("typo").field, "limt");
        assert!(error("typo").reason.contains("unknown field"));
        assert_eq!(error("wrong-type").field, "limit");
        assert!(error("wrong-type").reason.contains("invalid type"));
        assert_eq!(error("nested").field, "reserve.hihg");
    }

    /// Each entry's lines, in both formats and in the block, flow and inline spellings.
    #[test]
    fn rows_say_the_lines_of_their_entries_and_fields() {
        let lines = |text: &str, format| -> Vec<(String, u32, u32)> {
            parse_limits(text, format)
                .expect("parses")
                .into_iter()
                .map(|row| {
                    let lines = row.lines.expect("lines");
                    (row.name, lines.entry, lines.of("period_ms"))
                })
                .collect()
        };
        let toml = "[limits.a]\nkind = \"rate\"\nperiod_ms = 1\n\n[limits.b]\nlimit = 1\n\n[limits.c]\n\
                    period_ms = 2\n[other-limits]\n";
        assert!(
            parse_limits(toml, FileFormat::Toml).is_err(),
            "unknown table"
        );
        let toml = &toml[..toml.len() - "[other-limits]\n".len()];
        assert_eq!(
            lines(toml, FileFormat::Toml),
            [("a".into(), 1, 3), ("b".into(), 5, 5), ("c".into(), 8, 9)]
        );
        let yaml = "limits:\n  ab: {kind: rate, period_ms: 1}\n  a:\n    kind: rate\n\n    \
                    period_ms: 2\n  'c':\n    limit: 1\n";
        assert_eq!(
            lines(yaml, FileFormat::Yaml),
            [("a".into(), 3, 6), ("ab".into(), 2, 2), ("c".into(), 7, 7)]
        );
    }

    #[test]
    fn a_broken_file_is_refused_whole_and_says_where() {
        for (text, format, says) in [
            ("[limits.a\nkind = 1", FileFormat::Toml, "line 1"),
            (
                "[limit.a]\nkind = \"rate\"",
                FileFormat::Toml,
                "unknown field `limit`",
            ),
            ("", FileFormat::Toml, "missing field `limits`"),
            (
                "limits:\n  a: {kind: rate}\n  a: {kind: rate}\n",
                FileFormat::Yaml,
                "twice",
            ),
            (
                "limits: [1, 2]",
                FileFormat::Yaml,
                "a table of limits by name",
            ),
            ("limits:\n  a: {kind: rate\n", FileFormat::Yaml, "line"),
        ] {
            let error = parse_limits(text, format).expect_err("refused");
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }

    /// A file is outside input: aliases that would expand exponentially (here to 10^10 values,
    /// inside an entry, which is read untyped) are refused, not expanded.
    #[test]
    fn a_yaml_alias_bomb_is_refused() {
        let mut text = String::from("limits:\n  bomb:\n    a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for level in 1..=9u8 {
            let (name, previous) = (char::from(b'a' + level), char::from(b'a' + level - 1));
            let list = vec![format!("*{previous}"); 10].join(", ");
            text.push_str(&format!("    {name}: &{name} [{list}]\n"));
        }
        let error = parse_limits(&text, FileFormat::Yaml).expect_err("refused");
        assert!(error.contains("repetition limit"), "{error}");
    }

    #[test]
    fn an_exported_file_reads_back_the_same() {
        let rules = [
            RawRule {
                name: Some("a.b".into()),
                kind: Some("rate".into()),
                limit: Some(3),
                period_ms: Some(1000),
                algorithm: Some("gcra".into()),
                burst: Some(2),
                reserve: Some(crate::RawReserve {
                    high: Some(1),
                    normal: None,
                }),
                matcher: Some(crate::RawMatch {
                    method: Some("GET".into()),
                    path: Some("/v1/#".into()),
                }),
                per: Some("user".into()),
                ..RawRule::default()
            },
            RawRule {
                name: Some("pool".into()),
                kind: Some("concurrency".into()),
                limit: Some(2),
                lease_ttl_ms: Some(5000),
                ..RawRule::default()
            },
        ];
        for format in [FileFormat::Toml, FileFormat::Yaml] {
            let text = render_limits(&rules, format).expect("renders");
            let back: Vec<RawRule> = parse_limits(&text, format)
                .expect("parses")
                .into_iter()
                .map(|row| RawRule {
                    name: Some(row.name),
                    ..row.rule.expect("valid")
                })
                .collect();
            assert_eq!(back, rules, "{format:?}:\n{text}");
        }
    }

    #[test]
    fn the_url_names_a_toml_or_yaml_file() {
        assert!(FileSource::open("file://limits.toml").is_ok());
        assert!(FileSource::open("file:///etc/tollgate/limits.yml").is_ok());
        for bad in ["file://", "file://limits.json", "limits.toml"] {
            assert!(FileSource::open(bad).is_err(), "{bad}");
        }
    }
}
