//! Rows of the SQL rules table as an administrator may write them by hand (any SQLite value in
//! any cell), read by the rules source and put in force by a reload. A cell that cannot be read
//! refuses its row naming its column; every row is then in force or rejected naming a column
//! of the table, and nothing else is in force; a rule in force, written back as the admin API
//! writes it, reads back as the same rule.

use std::sync::OnceLock;

use arbitrary::Arbitrary;
use sqlx::SqlitePool;
use tollgate::{
    Limiter, LimiterConfig, MemoryStore, MemoryStoreConfig, MonotonicClock, PermitSecret,
};
use tollgate_rules::{COLUMNS, Rules, SqlSource, Validate, column_of};

/// Values an administrator might write: typed by SQLite's rules, or picked from the words and
/// figures a valid row holds, so that valid rows are found too.
#[derive(Arbitrary, Debug)]
enum Cell {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
    Word(u8),
    Figure(u8),
}

const WORDS: &[&str] = &[
    "rate",
    "concurrency",
    "sliding",
    "fixed",
    "gcra",
    "GET",
    "post",
    "*",
    "/",
    "/a/#",
    "/entity/123/bundle",
    "user",
    "vendor-x",
    "a.b:c",
    "",
    " ",
    "%ZZ",
    "/x/%2F",
];
const FIGURES: &[i64] = &[
    0,
    1,
    2,
    5,
    10,
    1_000,
    60_000,
    -1,
    i64::MAX,
    i64::MIN,
    9_223_372_036_854_776,
];

#[derive(Arbitrary, Debug)]
struct Row {
    name: Cell,
    cells: [Cell; 12],
}

struct Db {
    runtime: tokio::runtime::Runtime,
    admin: SqlitePool,
    rules: Rules,
    back: SqlSource,
}

fn db() -> &'static Db {
    static DB: OnceLock<Db> = OnceLock::new();
    DB.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let url = format!(
            "sqlite:file:tollgate-fuzz-sql-{}?mode=memory&cache=shared",
            std::process::id()
        );
        let (admin, rules, back) = runtime.block_on(async {
            let source = SqlSource::connect(&url, "fuzz_rows")
                .await
                .expect("a table");
            let back = SqlSource::connect(&url, "fuzz_back")
                .await
                .expect("a table");
            let admin = SqlitePool::connect(&url).await.expect("a connection");
            let limiter = Limiter::new(
                std::sync::Arc::new(MemoryStore::new(
                    MemoryStoreConfig {
                        keys_tracked_max: 1_000,
                        keys_per_limit_max: 1_000,
                    },
                    std::sync::Arc::new(MonotonicClock::new()),
                )),
                LimiterConfig {
                    wait_max: std::time::Duration::ZERO,
                    permit_secret: PermitSecret::random(),
                    pause_max: std::time::Duration::from_millis(tollgate::PAUSE_MS_MAX),
                    ..LimiterConfig::default()
                },
            );
            let rules = Rules::start(source, limiter).await.expect("rules");
            (admin, rules, back)
        });
        Db {
            runtime,
            admin,
            rules,
            back,
        }
    })
}

fn bind<'q>(
    query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    cell: &'q Cell,
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
    match cell {
        Cell::Null => query.bind(None::<i64>),
        Cell::Integer(value) => query.bind(*value),
        Cell::Real(value) => query.bind(*value),
        Cell::Text(value) => query.bind(value.as_str()),
        Cell::Blob(value) => query.bind(value.as_slice()),
        Cell::Word(index) => query.bind(WORDS[usize::from(*index) % WORDS.len()]),
        Cell::Figure(index) => query.bind(FIGURES[usize::from(*index) % FIGURES.len()]),
    }
}

/// One input of the target, as libFuzzer hands it over, read into `Vec<Row>` as
/// `libfuzzer_sys::fuzz_target!` reads a typed input (too short or unreadable: no run).
pub fn run_input(bytes: &[u8]) {
    if bytes.len() < <Vec<Row> as Arbitrary>::size_hint(0).0 {
        return;
    }
    let Ok(rows) =
        <Vec<Row> as Arbitrary>::arbitrary_take_rest(arbitrary::Unstructured::new(bytes))
    else {
        return;
    };
    if rows.len() > 16 {
        return;
    }
    let db = db();
    db.runtime.block_on(async {
        sqlx::query("DELETE FROM fuzz_rows")
            .execute(&db.admin)
            .await
            .expect("delete");
        let insert = format!(
            "INSERT INTO fuzz_rows ({}) VALUES ({})",
            COLUMNS.join(", "),
            vec!["?"; COLUMNS.len()].join(", ")
        );
        for row in &rows {
            let mut query = bind(sqlx::query(&insert), &row.name);
            for cell in &row.cells {
                query = bind(query, cell);
            }
            // A NULL name or kind, or a name given twice, is refused by the table itself.
            let _ = query.execute(&db.admin).await;
        }
        let table = match &db.rules.source() {
            tollgate_rules::RulesSource::Sql(source) => source,
            tollgate_rules::RulesSource::File(_) => unreachable!("a SQL source"),
        };
        let read = table.load().await.expect("the table reads");
        let mut names = Vec::new();
        for row in &read {
            names.push(row.name.clone());
            match &row.rule {
                Err(error) => {
                    assert!(COLUMNS.contains(&&*error.field), "{error}");
                    assert!(!error.reason.is_empty());
                }
                Ok(raw) => {
                    if let Err(error) = raw.validate(&row.name) {
                        assert!(COLUMNS.contains(&column_of(&error.field)), "{error}");
                        assert!(!error.reason.is_empty());
                    }
                }
            }
        }
        let snapshot = db.rules.reload().await.expect("a reload");
        for rule in snapshot.iter() {
            assert!(
                names.iter().any(|name| name == rule.name()),
                "{} has no row",
                rule.name()
            );
        }
        for rejected in snapshot.rejected() {
            assert!(COLUMNS.contains(&rejected.column.as_str()), "{rejected:?}");
            assert!(snapshot.get(&rejected.name).is_none() || rejected.previous_in_force);
        }
        for name in &names {
            assert!(
                snapshot.get(name).is_some()
                    || snapshot
                        .rejected()
                        .iter()
                        .any(|rejected| &rejected.name == name),
                "row {name:?} is neither in force nor rejected"
            );
        }
        // Written back as the admin API writes it, each rule in force reads back the same.
        sqlx::query("DELETE FROM fuzz_back")
            .execute(&db.admin)
            .await
            .expect("delete");
        for rule in snapshot.iter() {
            db.back.upsert(rule).await.expect("an upsert");
        }
        let back = db.back.load().await.expect("the table reads");
        assert_eq!(back.len(), snapshot.len());
        for row in back {
            let raw = row.rule.expect("a row written from a rule reads");
            let rule = raw
                .validate(&row.name)
                .expect("a row written from a rule validates");
            assert_eq!(Some(&rule), snapshot.get(&row.name).map(|rule| &**rule));
        }
    });
}
