//! The recipes in ARCHITECTURE.md stay true: every file a recipe names exists, every source file
//! that spells the whole list of denial reasons is named by "Add a denial reason", and every
//! field of the acquire answer is read by each client file "Add a field to the acquire answer"
//! names.

use std::fs;
use std::path::{Path, PathBuf};

use tollgate::DenyReason;

fn root() -> PathBuf {
    tollgate::conformance::package_dir(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// The text of `### title` in ARCHITECTURE.md's recipes, up to the next heading.
fn recipe(title: &str) -> String {
    let architecture = read(&root().join("ARCHITECTURE.md"));
    let start = architecture
        .find(&format!("### {title}\n"))
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no recipe {title:?}"));
    let body = &architecture[start + title.len() + 5..];
    let end = body.find("\n#").unwrap_or(body.len());
    body[..end].to_owned()
}

/// Every backquoted path in `text`: a name with a slash and an extension.
fn paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|quoted| {
            quoted.contains('/') && !quoted.contains(' ') && Path::new(quoted).extension().is_some()
        })
        .map(str::to_owned)
        .collect()
}

fn recipes() -> Vec<String> {
    let architecture = read(&root().join("ARCHITECTURE.md"));
    architecture
        .split("\n### ")
        .filter(|section| section.starts_with("Add "))
        .map(|section| section.lines().next().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn every_file_a_recipe_names_exists() {
    let titles = recipes();
    assert!(titles.len() >= 2, "the recipes were found: {titles:?}");
    for title in titles {
        let named = paths(&recipe(&title));
        assert!(!named.is_empty(), "{title:?} names no file");
        for path in named {
            assert!(
                root().join(&path).exists(),
                "the recipe {title:?} names {path}, which does not exist"
            );
        }
    }
}

/// Source files under `dir`, tests left out (a test may spell anything).
fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(
                name.as_str(),
                "tests"
                    | "test"
                    | "target"
                    | "node_modules"
                    | "corpus"
                    | "benches"
                    | "dist"
                    | "build"
                    | ".venv"
            ) {
                sources(&path, found);
            }
        } else if ["rs", "py", "ts", "kt", "java", "lua", "js"]
            .iter()
            .any(|extension| name.ends_with(&format!(".{extension}")))
            && !name.contains("test")
        {
            found.push(path);
        }
    }
}

#[test]
fn every_file_that_lists_the_denial_reasons_is_in_the_recipe() {
    let named = paths(&recipe("Add a denial reason"));
    let mut files = Vec::new();
    for dir in ["crates", "clients", "fuzz/src"] {
        sources(&root().join(dir), &mut files);
    }
    assert!(files.len() > 100, "the sources were found: {}", files.len());
    let mut listing = Vec::new();
    for file in files {
        let text = read(&file);
        // A Rust file's tests come after its `#[cfg(test)]`.
        let text = match text.find("#[cfg(test)]") {
            Some(tests) if file.extension().is_some_and(|e| e == "rs") => &text[..tests],
            _ => &text[..],
        };
        let lists = text.lines().any(|line| {
            DenyReason::ALL.iter().all(|reason| {
                line.contains(&format!("\"{}\"", reason.as_str()))
                    || line.contains(&format!("'{}'", reason.as_str()))
            })
        });
        if lists {
            let relative = file
                .strip_prefix(root())
                .unwrap_or(&file)
                .to_string_lossy()
                .into_owned();
            listing.push(relative);
        }
    }
    assert!(!listing.is_empty(), "no file lists the reasons");
    for file in listing {
        assert!(
            named.contains(&file),
            "{file} spells the list of denial reasons, and \"Add a denial reason\" in \
             ARCHITECTURE.md does not name it"
        );
    }
}

/// The fields of `struct name` in crates/api/src/data.rs.
fn fields(name: &str) -> Vec<String> {
    let data = read(&root().join("crates/api/src/data.rs"));
    let start = data
        .find(&format!("pub struct {name} {{"))
        .unwrap_or_else(|| panic!("data.rs has no struct {name}"));
    let body = &data[start..];
    let body = &body[..body.find("\n}").unwrap_or(body.len())];
    body.lines()
        .filter_map(|line| line.trim().strip_prefix("pub "))
        .filter_map(|line| line.split(':').next())
        .filter(|field| !field.contains(' '))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_client_the_recipe_names_reads_every_field_of_the_answer() {
    let named = paths(&recipe("Add a field to the acquire answer"));
    let mut answer = Vec::new();
    for name in ["LimitView", "Granted", "RateLimited"] {
        answer.extend(fields(name));
    }
    assert!(answer.len() >= 9, "the fields were found: {answer:?}");
    for client in ["clients/python", "clients/typescript", "clients/jvm"] {
        let files: Vec<&String> = named
            .iter()
            .filter(|path| path.starts_with(client))
            .collect();
        assert!(!files.is_empty(), "the recipe names no file of {client}");
        let text: String = files.iter().map(|path| read(&root().join(path))).collect();
        for field in &answer {
            let spelled = text
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .any(|word| word == field);
            assert!(
                spelled,
                "{client}: none of {files:?} reads the answer's field {field:?}; the recipe \
                 must name the file that does"
            );
        }
    }
}
