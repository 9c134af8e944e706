//! The README is a front page and the manual lives in `docs/`: every relative link of
//! README.md and docs/*.md reaches a file of the repository, every `#anchor` a heading of
//! the page it names (as GitHub makes anchors of headings), and the README stays short
//! enough to read in five minutes.

use std::collections::BTreeSet;
use std::path::PathBuf;

/// The README's most lines.
const README_LINES: usize = 300;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every page of docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).expect("docs/") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|ext| ext == "md") {
            pages.push(path);
        }
    }
    pages.sort();
    pages
}

/// The text of `page` outside code blocks and inline code, line by line.
fn prose(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let outside: String = (line.split('`').step_by(2)).collect::<Vec<_>>().join(" ");
        lines.push((number + 1, outside));
    }
    lines
}

/// GitHub's anchor for a heading: lower case, punctuation dropped (but `-` and `_`), spaces
/// as `-`; a repeated one gets `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(heading) = line.trim_start_matches('#').strip_prefix(' ') else {
            continue;
        };
        if fenced || !line.starts_with('#') {
            continue;
        }
        let slug: String = (heading.trim().to_lowercase().chars())
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut candidate = slug.clone();
        let mut n = 0;
        while !found.insert(candidate.clone()) {
            n += 1;
            candidate = format!("{slug}-{n}");
        }
    }
    found
}

/// The targets of `[text](target)` links in `line`.
fn links(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        found.push(after[..end].trim().to_owned());
        rest = &after[end..];
    }
    found
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("a page");
        let here = page.parent().expect("a directory");
        let name = page
            .strip_prefix(root())
            .expect("in the repository")
            .display();
        for (number, line) in prose(&text) {
            for target in links(&line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = target.split_once('#').unwrap_or((target.as_str(), ""));
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    here.join(path)
                };
                if !file.exists() {
                    broken.push(format!("{name}:{number}: {target}: no such file"));
                    continue;
                }
                if anchor.is_empty() {
                    continue;
                }
                let is_markdown = file.extension().is_some_and(|ext| ext == "md");
                let held = is_markdown
                    && anchors(&std::fs::read_to_string(&file).unwrap_or_default())
                        .contains(anchor);
                if !held {
                    broken.push(format!("{name}:{number}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_front_page_and_links_every_page_of_the_manual() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("the README");
    let lines = readme.lines().count();
    assert!(lines <= README_LINES, "README.md has {lines} lines");
    let index = std::fs::read_to_string(root().join("docs/README.md")).expect("the index");
    for page in pages() {
        let name = page
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        if page.parent() == Some(root().as_path()) || name == "README.md" {
            continue;
        }
        assert!(
            index.contains(&format!("]({name}")),
            "docs/README.md does not link {name}"
        );
    }
    assert!(
        readme.contains("bash scripts/test.sh"),
        "the README names the test command"
    );
}

/// The anchors and links the checks read are the ones GitHub makes and follows.
#[test]
fn the_checks_read_headings_and_links_as_github_does() {
    let text = "# Admin API: read and reset counters\n## `/rlconfig`\n## Notes\n## Notes\n\
                ```\n# not a heading\n```\n## envoyproxy/ratelimit's environment\n";
    let found = anchors(text);
    for anchor in [
        "admin-api-read-and-reset-counters",
        "rlconfig",
        "notes",
        "notes-1",
        "envoyproxyratelimits-environment",
    ] {
        assert!(found.contains(anchor), "{anchor} in {found:?}");
    }
    assert!(!found.contains("not-a-heading"));
    assert_eq!(
        links("see [a](b.md#c) and [d](../e) `[no](x)`"),
        ["b.md#c", "../e", "x"]
    );
    assert_eq!(prose("a `[no](x)` b")[0].1, "a   b");
}
