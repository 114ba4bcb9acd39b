//! The README's Rust programs are the workspace's examples, word for word: each block names its
//! file on its first line, and the file is built with the tests, so a program pasted from the
//! README compiles.

#[test]
fn every_rust_block_of_the_readme_is_an_example_file() {
    let workspace = tollgate::conformance::package_dir(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(workspace.join("README.md")).expect("README.md");
    let mut blocks = 0;
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if !line.starts_with("```rust") {
            continue;
        }
        let body: Vec<&str> = lines.by_ref().take_while(|line| *line != "```").collect();
        let first = body.first().copied().unwrap_or_default();
        let path = first
            .strip_prefix("// ")
            .and_then(|rest| rest.split(':').next())
            .unwrap_or_else(|| panic!("a README block that names no file: {first:?}"));
        let file = std::fs::read_to_string(workspace.join(path))
            .unwrap_or_else(|error| panic!("{path}: {error}"));
        assert_eq!(
            format!("{}\n", body.join("\n")),
            file,
            "the README's copy of {path} differs from the file"
        );
        blocks += 1;
    }
    assert!(blocks >= 3, "found {blocks} Rust blocks in the README");
}
