//! `switchyard strategies new`: a working strategy project in Rust, Python or JavaScript.
//!
//! The templates are embedded in the binary (`host/templates/strategy/`), so the command works
//! from an installed binary. Each project is the same small strategy (a weighted, prefill-aware
//! primary, declared fallbacks, the caller's affinity pin first), a build script that installs
//! the language's pinned tools and writes `NAME.wasm`, and a unit test in the language's own
//! runner; the scaffold builds and passes `switchyard strategies test NAME.wasm` as written
//! (tests/e2e/strategy_sdks.rs proves it for each language).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The languages `strategies new` scaffolds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

/// One file of a template: where it goes (with `NAME` replaced) and its text.
struct TemplateFile {
    path: &'static str,
    text: &'static str,
    executable: bool,
}

const fn file(path: &'static str, text: &'static str) -> TemplateFile {
    TemplateFile {
        path,
        text,
        executable: false,
    }
}

const fn script(path: &'static str, text: &'static str) -> TemplateFile {
    TemplateFile {
        path,
        text,
        executable: true,
    }
}

const RUST: &[TemplateFile] = &[
    file(
        "Cargo.toml",
        include_str!("../templates/strategy/rust/Cargo.toml"),
    ),
    file(
        "src/lib.rs",
        include_str!("../templates/strategy/rust/lib.rs"),
    ),
    script(
        "build.sh",
        include_str!("../templates/strategy/rust/build.sh"),
    ),
    file(".gitignore", "target/\nCargo.lock\n*.wasm\n"),
];

const PYTHON: &[TemplateFile] = &[
    file(
        "NAME.py",
        include_str!("../templates/strategy/python/strategy.py"),
    ),
    file(
        "test_NAME.py",
        include_str!("../templates/strategy/python/test_strategy.py"),
    ),
    script(
        "build.sh",
        include_str!("../templates/strategy/python/build.sh"),
    ),
    file(".gitignore", ".venv/\n__pycache__/\n*.wasm\n"),
];

const JS: &[TemplateFile] = &[
    file(
        "NAME.js",
        include_str!("../templates/strategy/js/strategy.js"),
    ),
    file(
        "NAME.test.js",
        include_str!("../templates/strategy/js/strategy.test.js"),
    ),
    file(
        "package.json",
        include_str!("../templates/strategy/js/package.json"),
    ),
    script(
        "build.sh",
        include_str!("../templates/strategy/js/build.sh"),
    ),
    file(".gitignore", "node_modules/\npackage-lock.json\n*.wasm\n"),
];

/// Names the glue of the Python SDK uses for itself (see sdk/python/switchyard_strategy/build.py).
const RESERVED: &[&str] = &[
    "strategy",
    "switchyard_app",
    "switchyard_strategy",
    "wit_world",
    "componentize_py_types",
    "test",
];

/// `NAME` must be a Rust crate, a Python module and a JavaScript file name at once.
fn check_name(name: &str) -> anyhow::Result<()> {
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= 64;
    if !valid {
        bail!(
            "strategy name `{name}`: use lowercase letters, digits and `_`, starting with a letter (it names the crate, module and file)"
        );
    }
    if RESERVED.contains(&name) {
        bail!("strategy name `{name}` is reserved by the SDKs' glue; pick another");
    }
    Ok(())
}

/// The `sdk/` folder of the checkout this binary was built from, when it is still there.
pub fn default_sdk_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk");
    dir.join("Cargo.toml")
        .is_file()
        .then(|| dir.canonicalize().unwrap_or(dir))
}

/// Writes the `lang` project for strategy `name` into `dir` (which must not exist or be empty),
/// depending on the SDKs in `sdk` (a checkout's `sdk/` folder). Returns the files written.
pub fn scaffold(name: &str, lang: Lang, dir: &Path, sdk: &Path) -> anyhow::Result<Vec<PathBuf>> {
    check_name(name)?;
    let sdk = sdk
        .canonicalize()
        .with_context(|| format!("--sdk {}", sdk.display()))?;
    let wanted = match lang {
        Lang::Rust => sdk.join("Cargo.toml"),
        Lang::Python => sdk.join("python/pyproject.toml"),
        Lang::Js => sdk.join("js/package.json"),
    };
    if !wanted.is_file() {
        bail!(
            "{} is not a Switchyard SDK folder (no {}); pass --sdk with the sdk/ folder of a checkout",
            sdk.display(),
            wanted.display()
        );
    }
    let sdk_text = sdk
        .to_str()
        .context("the SDK's path is not UTF-8")?
        .to_owned();
    if dir.exists()
        && std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .next()
            .is_some()
    {
        bail!(
            "{} exists and is not empty; pick a new folder with --dir",
            dir.display()
        );
    }
    let files = match lang {
        Lang::Rust => RUST,
        Lang::Python => PYTHON,
        Lang::Js => JS,
    };
    let mut written = Vec::with_capacity(files.len());
    for f in files {
        let path = dir.join(f.path.replace("NAME", name));
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        let text = f
            .text
            .replace("{{name}}", name)
            .replace("{{sdk}}", &sdk_text);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        if f.executable {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .with_context(|| format!("making {} executable", path.display()))?;
        }
        written.push(path);
    }
    Ok(written)
}

/// What to run next, for the user.
pub fn next_steps(name: &str, lang: Lang, dir: &Path) -> String {
    let test = match lang {
        Lang::Rust => "cargo test",
        Lang::Python => ".venv/bin/python -m unittest",
        Lang::Js => "npm test",
    };
    let steps = [
        (format!("cd {}", dir.display()), String::new()),
        ("./build.sh".to_owned(), format!("writes {name}.wasm")),
        (test.to_owned(), "the logic, natively".to_owned()),
        (
            format!("switchyard strategies test {name}.wasm"),
            "the router contract suite".to_owned(),
        ),
    ];
    let width = steps.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
    let mut text = String::from("next:\n");
    for (command, why) in steps {
        if why.is_empty() {
            text.push_str(&format!("  {command}\n"));
        } else {
            text.push_str(&format!("  {command:<width$}  # {why}\n"));
        }
    }
    text.push_str(&format!(
        "then copy {name}.wasm into the config's strategies.dir and set `router: {name}` on a model"
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_fit_every_language() {
        for good in ["least_backlog", "a", "v2_router"] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "Upper",
            "9lives",
            "has-dash",
            "has space",
            "strategy",
            "wit_world",
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_placeholder_is_filled_and_nothing_overwritten() {
        let Some(sdk) = default_sdk_dir() else {
            panic!("the checkout's sdk/ folder is missing");
        };
        for lang in [Lang::Rust, Lang::Python, Lang::Js] {
            let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
            let project = dir.path().join("p");
            let files = scaffold("my_router", lang, &project, &sdk)
                .unwrap_or_else(|e| panic!("{lang:?}: {e:#}"));
            for path in &files {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                assert!(
                    !text.contains("{{") && !path.to_string_lossy().contains("NAME"),
                    "{lang:?}: {} keeps a placeholder",
                    path.display()
                );
            }
            let again = scaffold("my_router", lang, &project, &sdk);
            assert!(
                again.is_err_and(|e| e.to_string().contains("not empty")),
                "{lang:?}"
            );
        }
        let elsewhere = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let refused = scaffold(
            "x",
            Lang::Python,
            &elsewhere.path().join("p"),
            elsewhere.path(),
        );
        assert!(refused.is_err_and(|e| e.to_string().contains("not a Switchyard SDK folder")));
    }
}
