//! What a component needs from its host, read from the binary before anything is compiled.
//!
//! Compiling an interpreted guest (a Python or StarlingMonkey component, 10–12 MB) takes seconds;
//! linking it afterwards against imports the host does not provide fails with wasmtime's view of
//! the problem ("instance export `fields` has the wrong type"). Reading the import section with
//! `wasmparser` takes microseconds and can name the import and the build flag that removes it.
//!
//! An import the host does not provide is *rejected*, not stubbed with a trap
//! (`Linker::define_unknown_imports_as_traps`): a stub would let the component load and then fail
//! on the request path at the first call that reaches it, where the fallback to declared order
//! hides the failure. Refused at load, the operator reads the reason in `strategies list`,
//! `/health/deep` and the reload response. The same holds for the component-model async ABI, which
//! this host's engine does not run.

use wasmparser::{CanonicalFunction, CanonicalOption, Parser, Payload};

use super::wit::SUPPORTED_API_VERSIONS;

/// WASI 0.2 packages the host links (every strategy store has no preopens, no environment and
/// no sockets allowed, so none of them reaches outside the sandbox).
const WASI_PACKAGES: &[&str] = &[
    "wasi:cli",
    "wasi:clocks",
    "wasi:filesystem",
    "wasi:io",
    "wasi:random",
    "wasi:sockets",
];

/// The WIT package, whose interfaces (`host`, `types`) are provided at every supported version.
const ROUTER_PACKAGE: &str = "switchyard:router";

/// The component's top-level imports, and the first async-ABI construct it uses, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ComponentShape {
    /// Import names as written in the component (`wasi:io/streams@0.2.6`).
    pub imports: Vec<String>,
    /// The first canonical function of the component-model async ABI found (`canon task-return`…).
    pub async_abi: Option<String>,
}

/// Reads the top-level imports and scans every nested component for the async ABI, without
/// validating or compiling anything. Fails only when the binary does not parse.
pub fn read(bytes: &[u8]) -> Result<ComponentShape, String> {
    let mut shape = ComponentShape::default();
    // `parse_all` walks nested modules and components inline, each between a `Version` and its
    // `End`; only the outermost component's imports are the host's to provide.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| format!("not a valid component: {e}"))?;
        match payload {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(|e| format!("not a valid component: {e}"))?;
                    shape.imports.push(import.name.name.to_owned());
                }
            }
            Payload::ComponentCanonicalSection(reader) if shape.async_abi.is_none() => {
                for function in reader {
                    let function = function.map_err(|e| format!("not a valid component: {e}"))?;
                    shape.async_abi = async_construct(&function);
                    if shape.async_abi.is_some() {
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(shape)
}

/// The async-ABI construct `function` is, named as in the text format, if it is one.
fn async_construct(function: &CanonicalFunction) -> Option<String> {
    match function {
        CanonicalFunction::Lift { options, .. } | CanonicalFunction::Lower { options, .. } => {
            let kind = if matches!(function, CanonicalFunction::Lift { .. }) {
                "lift"
            } else {
                "lower"
            };
            options
                .iter()
                .any(|o| matches!(o, CanonicalOption::Async | CanonicalOption::Callback(_)))
                .then(|| format!("canon {kind} async"))
        }
        // Resources and threads are synchronous; everything else the reader knows of (tasks,
        // subtasks, waitables, streams, futures, error contexts, backpressure, context slots)
        // belongs to the async ABI.
        CanonicalFunction::ResourceNew { .. }
        | CanonicalFunction::ResourceDrop { .. }
        | CanonicalFunction::ResourceRep { .. }
        | CanonicalFunction::ThreadSpawnRef { .. }
        | CanonicalFunction::ThreadSpawnIndirect { .. }
        | CanonicalFunction::ThreadAvailableParallelism => None,
        other => {
            let debug = format!("{other:?}");
            let variant = debug
                .split(|c: char| !c.is_alphanumeric())
                .next()
                .unwrap_or("?");
            Some(format!("canon {}", text_name(variant)))
        }
    }
}

/// `TaskReturn` → `task-return`: the built-in's name in kebab case (the text format puts a dot
/// at one of the dashes, `task.return`, `waitable-set.new`).
fn text_name(variant: &str) -> String {
    let mut out = String::new();
    for (i, c) in variant.chars().enumerate() {
        if c.is_uppercase() {
            if i > 0 {
                out.push('-');
            }
            out.extend(c.to_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Checks that the host provides every import and that the async ABI is not used; the error names
/// the first import at fault and how to build without it.
pub fn check(shape: &ComponentShape) -> Result<(), String> {
    if let Some(construct) = &shape.async_abi {
        return Err(format!(
            "uses the component-model async ABI ({construct}), which this host does not run: \
             strategies are synchronous calls; for QuickJS through jco build with \
             --backend-qjs-disable-async"
        ));
    }
    for import in &shape.imports {
        if let Some(problem) = unsupported(import) {
            return Err(problem);
        }
    }
    Ok(())
}

/// Why the host cannot provide `import`, or `None` when it does.
fn unsupported(import: &str) -> Option<String> {
    let (path, version) = import.split_once('@').unwrap_or((import, ""));
    let package = path.split_once('/').map_or(path, |(p, _)| p);
    // `host` and the type-only interfaces (`types`) the strategy world pulls in.
    if package == ROUTER_PACKAGE {
        return (!SUPPORTED_API_VERSIONS.contains(&version)).then(|| {
            format!(
                "imports {import}: built against switchyard:router@{version}, this host runs {}",
                SUPPORTED_API_VERSIONS.join(", ")
            )
        });
    }
    if WASI_PACKAGES.contains(&package) {
        // wasmtime matches 0.2.x imports against its own 0.2 release whatever the patch level.
        return (!version.starts_with("0.2.")).then(|| {
            format!(
                "imports {import}: this host provides WASI 0.2 only; build for wasm32-wasip2 (WASI 0.2)"
            )
        });
    }
    if package == "wasi:http" {
        return Some(format!(
            "imports {import}: strategies get no network; for componentize-js build with \
             -d http fetch-event"
        ));
    }
    Some(format!(
        "imports {import}, which this host does not provide: a strategy may import \
         {ROUTER_PACKAGE} and WASI 0.2 ({}) only",
        WASI_PACKAGES
            .iter()
            .map(|p| p.trim_start_matches("wasi:"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(imports: &[&str]) -> ComponentShape {
        ComponentShape {
            imports: imports.iter().map(|s| s.to_string()).collect(),
            async_abi: None,
        }
    }

    #[test]
    fn wasi_0_2_and_the_host_interface_are_provided() {
        assert_eq!(
            check(&shape(&[
                "wasi:io/streams@0.2.6",
                "wasi:cli/environment@0.2.10",
                "switchyard:router/types@0.2.0",
                "switchyard:router/host@0.2.0",
                "switchyard:router/host@0.1.0",
            ])),
            Ok(())
        );
    }

    #[test]
    fn wasi_http_is_refused_with_the_build_flag() {
        let err = check(&shape(&["wasi:io/streams@0.2.6", "wasi:http/types@0.2.10"])).unwrap_err();
        assert!(err.starts_with("imports wasi:http/types@0.2.10"), "{err}");
        assert!(err.contains("no network"), "{err}");
        assert!(err.contains("-d http fetch-event"), "{err}");
    }

    #[test]
    fn other_imports_and_versions_are_refused_by_name() {
        let err = check(&shape(&["acme:net/fetch@1.0.0"])).unwrap_err();
        assert!(err.contains("imports acme:net/fetch@1.0.0"), "{err}");
        let err = check(&shape(&["wasi:io/streams@0.3.0"])).unwrap_err();
        assert!(err.contains("WASI 0.2 only"), "{err}");
        let err = check(&shape(&["switchyard:router/host@9.0.0"])).unwrap_err();
        assert!(err.contains("switchyard:router@9.0.0"), "{err}");
    }

    #[test]
    fn the_async_abi_is_refused_with_the_build_flag() {
        let err = check(&ComponentShape {
            imports: vec![],
            async_abi: Some("canon task-return".into()),
        })
        .unwrap_err();
        assert!(err.contains("async ABI (canon task-return)"), "{err}");
        assert!(err.contains("--backend-qjs-disable-async"), "{err}");
    }

    #[test]
    fn variant_names_read_as_the_text_format() {
        assert_eq!(text_name("TaskReturn"), "task-return");
        assert_eq!(text_name("WaitableSetNew"), "waitable-set-new");
    }

    #[test]
    fn garbage_does_not_parse() {
        assert!(read(b"\0asm\x0d\0\x01\0\xff").is_err());
    }
}
