//! The CI and release workflows in `.github/workflows`: actionlint (with
//! shellcheck on their scripts) accepts them and rejects a broken one, and
//! the release workflow does what a release needs: the README's test
//! command, the image for linux/amd64 and linux/arm64, the chart pushed to
//! an OCI registry, an SBOM, and a tag that must name Cargo.toml's version.
//! actionlint and shellcheck are installed by `bash tests/run-all.sh`.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_norway::Value;

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The actionlint binary in the tools venv; panics with what to run when
/// it is missing.
fn actionlint() -> PathBuf {
    let path = root().join(".tools/venv/bin/actionlint");
    assert!(
        path.is_file(),
        "actionlint is missing at {}; run `bash tests/run-all.sh` (it installs it into .tools/venv)",
        path.display()
    );
    path
}

/// Panics with what to run unless shellcheck is on PATH: without it
/// actionlint skips the `run:` scripts without a word.
fn require_shellcheck() {
    let found = Command::new("shellcheck").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "shellcheck is not on PATH; run `bash tests/run-all.sh` (it installs Debian's shellcheck)"
    );
}

/// Every workflow file in `.github/workflows`, sorted.
fn workflow_files() -> Vec<PathBuf> {
    let dir = root().join(".github/workflows");
    let entries =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yml" | "yaml")))
        .collect();
    files.sort();
    files
}

/// actionlint on `files`, run from the repository's root (where it finds
/// `.github`), colours off.
fn run_actionlint(files: &[PathBuf]) -> Output {
    Command::new(actionlint())
        .arg("-no-color")
        .args(files)
        .current_dir(root())
        .output()
        .expect("actionlint runs")
}

/// stdout and stderr of `out`, for messages.
fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A workflow file parsed.
fn workflow(name: &str) -> Value {
    let path = root().join(".github/workflows").join(name);
    let source = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_norway::from_str(&source).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The jobs of a workflow, by id.
fn jobs(workflow: &Value) -> Vec<(&str, &Value)> {
    workflow["jobs"]
        .as_mapping()
        .expect("a jobs map")
        .iter()
        .map(|(id, job)| (id.as_str().expect("a job id"), job))
        .collect()
}

/// The steps of a job (none for a job that calls a reusable workflow).
fn steps(job: &Value) -> &[Value] {
    job["steps"].as_sequence().map_or(&[], Vec::as_slice)
}

/// The `run:` scripts of a job's steps, joined.
fn scripts(job: &Value) -> String {
    steps(job)
        .iter()
        .filter_map(|step| step["run"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The one job of `workflow` whose scripts contain `needle`.
fn job_running<'a>(workflow: &'a Value, needle: &str) -> (&'a str, &'a Value) {
    let found: Vec<_> = jobs(workflow)
        .into_iter()
        .filter(|(_, job)| scripts(job).contains(needle))
        .collect();
    assert_eq!(found.len(), 1, "jobs running `{needle}`: {found:?}");
    found[0]
}

/// The README's test command: the code block after "Run the whole test suite".
fn readme_test_command() -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let at = readme
        .find("Run the whole test suite")
        .expect("the README tells how to run the test suite");
    let block = &readme[at..];
    let start = block.find("```sh\n").expect("a sh block after it") + "```sh\n".len();
    let end = start + block[start..].find("```").expect("the block's end");
    let command = block[start..end].trim().to_owned();
    assert!(
        !command.is_empty() && !command.contains('\n'),
        "{command:?}"
    );
    command
}

#[test]
fn actionlint_accepts_the_workflows() {
    require_shellcheck();
    let files = workflow_files();
    let names: Vec<_> = files.iter().filter_map(|p| p.file_name()).collect();
    assert!(
        names.contains(&"ci.yml".as_ref()) && names.contains(&"release.yml".as_ref()),
        "{names:?}"
    );
    let out = run_actionlint(&files);
    assert!(
        out.status.success(),
        "actionlint rejects the workflows:\n{}",
        text(&out)
    );
}

/// A workflow with one mistake of each kind actionlint looks for: an
/// unknown key, a job without `runs-on`, an expression on an undefined
/// context, and a script shellcheck warns about.
const BROKEN: &str = r#"name: broken
on:
  push:
    branch: main
jobs:
  build:
    steps:
      - run: echo ${{ matrix.missing }}
  lint:
    runs-on: ubuntu-24.04
    steps:
      - run: for f in $(ls *.txt); do echo $f; done
"#;

#[test]
fn actionlint_rejects_a_broken_workflow() {
    require_shellcheck();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let workflows = dir.path().join(".github/workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    let broken = workflows.join("broken.yml");
    std::fs::write(&broken, BROKEN).unwrap();
    let out = Command::new(actionlint())
        .arg("-no-color")
        .arg(&broken)
        .current_dir(dir.path())
        .output()
        .expect("actionlint runs");
    let report = text(&out);
    assert!(!out.status.success(), "actionlint accepted:\n{report}");
    let findings = [
        "unexpected key \"branch\"",
        "\"runs-on\" section is missing",
        "property \"missing\" is not defined",
        "[shellcheck]",
    ];
    for finding in findings {
        assert!(
            report.contains(finding),
            "no finding about {finding}:\n{report}"
        );
    }
}

#[test]
fn ci_runs_the_readme_test_command_on_pushes_and_pull_requests() {
    let command = readme_test_command();
    let ci = workflow("ci.yml");
    for event in ["push", "pull_request", "workflow_call"] {
        assert!(
            ci["on"].get(event).is_some(),
            "ci.yml is not run on {event}"
        );
    }
    job_running(&ci, &command);
}

#[test]
fn release_runs_the_readme_test_command_before_publishing() {
    let release = workflow("release.yml");
    // The test job calls ci.yml, which runs the README's command (checked above).
    let test: Vec<_> = jobs(&release)
        .into_iter()
        .filter(|(_, job)| job["uses"].as_str() == Some("./.github/workflows/ci.yml"))
        .map(|(id, _)| id)
        .collect();
    assert_eq!(test.len(), 1, "release.yml calls ci.yml once: {test:?}");
    let (_, publish) = job_running(&release, "helm push");
    let needs: Vec<_> = publish["needs"]
        .as_sequence()
        .expect("publish needs jobs")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        needs.contains(&test[0]),
        "publishing does not wait for the tests: {needs:?}"
    );
}

#[test]
fn release_builds_the_image_for_amd64_and_arm64_and_pushes_one_manifest() {
    let release = workflow("release.yml");
    let (id, build) = job_running(&release, "scripts/build-image.sh");
    let include = build["strategy"]["matrix"]["include"]
        .as_sequence()
        .expect("the image job has a matrix of platforms");
    let mut arches: Vec<(&str, &str)> = include
        .iter()
        .map(|row| {
            let arch = row["arch"].as_str().expect("an arch");
            let runner = row["runner"].as_str().expect("a runner");
            (arch, runner)
        })
        .collect();
    arches.sort();
    let names: Vec<_> = arches.iter().map(|(arch, _)| *arch).collect();
    assert_eq!(names, ["amd64", "arm64"], "{arches:?}");
    // Built natively: the arm64 image on an arm64 runner.
    assert!(arches[1].1.contains("arm"), "{arches:?}");
    assert_eq!(build["runs-on"].as_str(), Some("${{ matrix.runner }}"));
    assert!(
        scripts(build).contains("\"linux/$ARCH\""),
        "no platform check"
    );

    let (_, publish) = job_running(&release, "manifest push --all");
    let needs = publish["needs"].as_sequence().expect("publish needs jobs");
    assert!(needs.iter().any(|n| n.as_str() == Some(id)), "{needs:?}");
    let script = scripts(publish);
    assert!(script.contains("for arch in amd64 arm64"), "{script}");
    assert!(script.contains("linux/amd64,linux/arm64"), "{script}");
    assert!(script.contains("ghcr.io/$owner/divvy"), "{script}");
}

#[test]
fn release_packages_the_chart_at_the_tag_version_and_pushes_it_to_an_oci_registry() {
    let release = workflow("release.yml");
    let (_, publish) = job_running(&release, "helm push");
    let script = scripts(publish);
    assert!(
        script.contains("--version \"$VERSION\" --app-version \"$VERSION\""),
        "{script}"
    );
    assert!(script.contains("charts=oci://ghcr.io/"), "{script}");
    assert!(
        script.contains("helm push \"dist/divvy-$VERSION.tgz\" \"$CHARTS\""),
        "{script}"
    );
    let push = steps(publish)
        .iter()
        .find(|s| s["run"].as_str().is_some_and(|r| r.contains("helm push")))
        .unwrap();
    assert_eq!(
        push["env"]["CHARTS"].as_str(),
        Some("${{ steps.names.outputs.charts }}")
    );
}

#[test]
fn release_attaches_an_spdx_sbom() {
    let release = workflow("release.yml");
    let (_, publish) = job_running(&release, "gh release create");
    let sbom = steps(publish)
        .iter()
        .find(|s| {
            s["uses"]
                .as_str()
                .is_some_and(|u| u.starts_with("anchore/sbom-action@"))
        })
        .expect("a step of anchore/sbom-action");
    assert_eq!(sbom["with"]["format"].as_str(), Some("spdx-json"));
    let file = sbom["with"]["output-file"]
        .as_str()
        .expect("an output file");
    let name = file.rsplit('/').next().unwrap();
    let attached = name.replace("${{ needs.version.outputs.version }}", "$VERSION");
    assert!(
        scripts(publish).contains(&format!("$RUNNER_TEMP/{attached}")),
        "{attached}"
    );
}

#[test]
fn actions_are_pinned_and_write_permissions_are_only_where_needed() {
    for file in workflow_files() {
        let name = file.file_name().unwrap().to_str().unwrap().to_owned();
        let parsed = workflow(&name);
        assert!(
            parsed.get("permissions").is_some(),
            "{name}: no top-level permissions"
        );
        for (id, job) in jobs(&parsed) {
            for step in steps(job) {
                let Some(uses) = step["uses"].as_str() else {
                    continue;
                };
                let (_, rev) = uses.split_once('@').expect("owner/repo@revision");
                let pinned = rev.len() == 40 && rev.chars().all(|c| c.is_ascii_hexdigit());
                assert!(pinned, "{name} {id}: {uses} is not pinned to a commit");
            }
            let writes: Vec<_> = job["permissions"]
                .as_mapping()
                .into_iter()
                .flatten()
                .filter(|(_, v)| v.as_str() == Some("write"))
                .map(|(k, _)| k.as_str().unwrap())
                .collect();
            let allowed: &[&str] = if id == "publish" {
                &["contents", "packages"]
            } else {
                &[]
            };
            assert_eq!(writes, allowed, "{name} {id}");
        }
    }
}

/// The release's version check, run as the workflow runs it, for `tag`:
/// whether it passed, and what it wrote to `GITHUB_OUTPUT`.
fn version_check(tag: &str) -> (bool, String) {
    let release = workflow("release.yml");
    let job = &release["jobs"]["version"];
    let step = steps(job)
        .iter()
        .find(|s| s["id"].as_str() == Some("version"))
        .expect("the version job's step `version`");
    let script = step["run"].as_str().expect("a script");
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("github-output");
    std::fs::write(&output, "").unwrap();
    let status = Command::new("bash")
        .args(["-e", "-c", script])
        .env("TAG", tag)
        .env("GITHUB_OUTPUT", &output)
        .current_dir(root())
        .status()
        .expect("bash runs");
    (status.success(), std::fs::read_to_string(&output).unwrap())
}

/// The `version = "..."` of Cargo.toml's `[package]` table (the first such
/// line after it).
fn crate_version() -> String {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let package = manifest.find("[package]").expect("a [package] table");
    manifest[package..]
        .lines()
        .find_map(|line| line.strip_prefix("version = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("a package version")
        .to_owned()
}

#[test]
fn the_release_fails_on_a_tag_that_is_not_cargo_toml_version() {
    let version = crate_version();
    let (ok, output) = version_check(&format!("v{version}"));
    assert!(ok, "v{version} refused");
    assert_eq!(output, format!("version={version}\n"));
    for tag in [
        format!("v{version}.1"),
        "v0.0.0-not-this".to_owned(),
        version.clone(),
    ] {
        let (ok, _) = version_check(&tag);
        assert!(!ok, "the tag {tag} passed with Cargo.toml at {version}");
    }
}
