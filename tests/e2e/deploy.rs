//! deploy/: the container image and the Helm chart, checked without a cluster or a Docker daemon.
//!
//! - `deploy/check.py`, in a virtualenv with the pinned deploy/requirements.txt (built once under
//!   the target dir): `helm lint` and the chart's renders through Helm's own Go SDK,
//!   deploy/manifests/ equal to the render, every object against Kubernetes' schemas (the
//!   ServiceMonitor against the Prometheus Operator CRD), hadolint, the chart's objects against each
//!   other and the Dockerfile against the repository.
//! - The real binary started the way the chart's pod and the image start it: the rendered config at
//!   its mount path, the container's environment, the image's layout (`/opt/switchyard`), as uid
//!   10001 on a read-only root where only the declared volumes and /tmp can be written (bubblewrap;
//!   its own network namespace, so the fixed ports 8080 and 9464 collide with nothing); then the
//!   probes, the metrics port and SIGTERM, as Kubernetes would send them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

use crate::harness::{binary, component, python_venv, repo};

/// A virtualenv with deploy/requirements.txt, rebuilt when that file changes (the layout
/// `cargo xtask deploy-manifests` uses too).
fn deploy_python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| python_venv("deploy-venv", "deploy/requirements.txt"))
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn chart_manifests_and_dockerfile_pass_the_offline_checks() {
    let output = Command::new(deploy_python())
        .arg("deploy/check.py")
        .current_dir(repo())
        .output()
        .expect("run deploy/check.py");
    let text = text(&output);
    println!("{text}");
    assert!(output.status.success(), "deploy/check.py failed:\n{text}");
    assert!(text.contains("deploy checks passed"), "{text}");
}

/// bubblewrap builds the read-only root; installed from Debian when missing.
fn bwrap() -> &'static str {
    let installed = || {
        Command::new("bwrap")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !installed() {
        let apt = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status()
                .is_ok_and(|s| s.success())
        };
        if !apt(&["install", "-y", "-qq", "bubblewrap"]) {
            apt(&["update", "-qq"]);
            apt(&["install", "-y", "-qq", "bubblewrap"]);
        }
    }
    assert!(
        installed(),
        "`apt-get install -y bubblewrap` did not install bwrap; this test needs it"
    );
    "bwrap"
}

/// Inside the sandbox: start the gateway, wait (bounded) for liveness, ask readiness and the
/// metrics port, then SIGTERM and report the exit status. Lines starting with `probe ` are the
/// results; everything else is the gateway's own output.
const PROBE_SCRIPT: &str = r#"
probe() { curl -s -o /dev/null -w '%{http_code}' -m 5 "http://127.0.0.1:$1$2"; }
"$@" &
pid=$!
status=000
i=0
# 1200 tries 0.1 s apart: two minutes for the first answer on a loaded machine.
while [ $i -lt 1200 ]; do
    status=$(probe "$PROBE_PORT" "$PROBE_LIVENESS")
    [ "$status" = 200 ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
    i=$((i + 1))
done
echo "probe liveness $status"
echo "probe readiness $(probe "$PROBE_PORT" "$PROBE_READINESS")"
if [ -n "$PROBE_METRICS_PORT" ]; then
    echo "probe metrics $(curl -s -m 5 "http://127.0.0.1:$PROBE_METRICS_PORT/metrics" | grep -c '^switchyard_')"
fi
kill -TERM $pid
wait $pid
echo "probe exit $?"
"#;

/// What one sandboxed run reported.
struct Run {
    probes: Vec<(String, String)>,
    output: String,
    volumes: Vec<(String, PathBuf)>,
    /// Holds the volumes' host folders until the assertions are done.
    _scratch: tempfile::TempDir,
}

impl Run {
    fn probe(&self, name: &str) -> &str {
        self.probes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no `probe {name}` line:\n{}", self.output))
    }

    fn volume(&self, path: &str) -> &Path {
        &self.volumes.iter().find(|(p, _)| p == path).unwrap().1
    }
}

/// Runs the gateway as `spec` (from `deploy/check.py --runtime`) says: its config file at
/// `config_path`, its environment, its uid, the image's entrypoint and layout, and a read-only root
/// with only `writable` (empty host folders) writable.
fn run_sandboxed(spec: &Value, env: &serde_json::Map<String, Value>, config: &Path) -> Run {
    let scratch = tempfile::tempdir().unwrap();
    let strategies = component("strategies", "fixed")
        .parent()
        .unwrap()
        .to_owned();
    let uid = spec["uid"].as_u64().unwrap().to_string();
    let mut command = Command::new(bwrap());
    command.args(["--die-with-parent", "--unshare-pid", "--unshare-net"]);
    command.args([
        "--unshare-user",
        "--uid",
        uid.as_str(),
        "--gid",
        uid.as_str(),
    ]);
    command.arg("--clearenv");
    command.args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]);
    // The image's own folders: on the host they do not exist, so each is a fresh tmpfs holding only
    // what the image or the pod puts there, made read-only once mounted.
    command.args(["--tmpfs", "/etc", "--tmpfs", "/var", "--tmpfs", "/opt"]);
    command.args(["--ro-bind", binary(), "/opt/switchyard/bin/switchyard"]);
    command.arg("--ro-bind").arg(&strategies);
    command.arg("/opt/switchyard/strategies");
    command.arg("--ro-bind").arg(config);
    command.arg(spec["config_path"].as_str().unwrap());
    let mut volumes = Vec::new();
    for (i, path) in spec["writable"].as_array().unwrap().iter().enumerate() {
        let path = path.as_str().unwrap();
        if path == "/tmp" {
            command.args(["--tmpfs", "/tmp"]);
            continue;
        }
        let host = scratch.path().join(format!("volume-{i}"));
        std::fs::create_dir(&host).unwrap();
        command.arg("--bind").arg(&host).arg(path);
        volumes.push((path.to_owned(), host));
    }
    command.args([
        "--remount-ro",
        "/etc",
        "--remount-ro",
        "/var",
        "--remount-ro",
        "/opt",
    ]);
    command.args(["--setenv", "PATH", "/usr/sbin:/usr/bin:/sbin:/bin"]);
    // Docker sets HOME from the image user's passwd entry.
    command.args(["--setenv", "HOME", "/var/lib/switchyard"]);
    for (name, value) in env {
        command.args(["--setenv", name, value.as_str().unwrap()]);
    }
    let port = spec["port"].to_string();
    let metrics = spec["metrics_port"].as_u64().map(|p| p.to_string());
    command.args(["--setenv", "PROBE_PORT", port.as_str()]);
    command.args([
        "--setenv",
        "PROBE_METRICS_PORT",
        metrics.as_deref().unwrap_or(""),
    ]);
    command.args([
        "--setenv",
        "PROBE_LIVENESS",
        spec["liveness"].as_str().unwrap(),
    ]);
    command.args([
        "--setenv",
        "PROBE_READINESS",
        spec["readiness"].as_str().unwrap(),
    ]);
    command.args(["/bin/sh", "-c", PROBE_SCRIPT, "sh"]);
    for word in spec["entrypoint"]
        .as_array()
        .unwrap()
        .iter()
        .chain(spec["args"].as_array().unwrap())
    {
        command.arg(word.as_str().unwrap());
    }
    let output = command.output().expect("run bwrap");
    let output = text(&output);
    let probes = output
        .lines()
        .filter_map(|l| l.strip_prefix("probe "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, v)| (n.to_owned(), v.trim().to_owned()))
        .collect();
    Run {
        probes,
        output,
        volumes,
        _scratch: scratch,
    }
}

#[test]
fn the_chart_pod_and_the_image_serve_on_a_read_only_root() {
    let out = tempfile::tempdir().unwrap();
    let output = Command::new(deploy_python())
        .args(["deploy/check.py", "--runtime"])
        .arg(out.path())
        .current_dir(repo())
        .output()
        .expect("run deploy/check.py --runtime");
    assert!(output.status.success(), "{}", text(&output));
    let read = |name: &str| -> Value {
        let path = out.path().join(name).join("runtime.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    let image = read("image");
    let chart = read("chart");
    // The pod runs the image: its environment is the image's ENV with the pod's env on top.
    let mut pod_env = image["env"].as_object().unwrap().clone();
    pod_env.extend(chart["env"].as_object().unwrap().clone());
    let mut pod = chart.clone();
    pod["entrypoint"] = image["entrypoint"].clone();

    for (name, spec, env) in [
        ("image", &image, image["env"].as_object().unwrap().clone()),
        ("chart", &pod, pod_env),
    ] {
        let config_name = Path::new(spec["config_path"].as_str().unwrap())
            .file_name()
            .unwrap()
            .to_owned();
        let run = run_sandboxed(spec, &env, &out.path().join(name).join(config_name));
        let output = &run.output;
        assert_eq!(run.probe("liveness"), "200", "{name}: liveness\n{output}");
        assert_eq!(
            run.probe("readiness"),
            spec["ready_status"].to_string(),
            "{name}: readiness\n{output}"
        );
        if spec["metrics_port"].is_u64() {
            let series: u64 = run.probe("metrics").parse().unwrap();
            assert!(
                series > 0,
                "{name}: no switchyard_ series on the metrics port\n{output}"
            );
        }
        assert_eq!(
            run.probe("exit"),
            "0",
            "{name}: exit after SIGTERM\n{output}"
        );
        // Nothing tried to write outside the volumes: EROFS would show as an error or a warning.
        for sign in ["Read-only file system", "os error 30", "cache disabled"] {
            assert!(!output.contains(sign), "{name}: `{sign}`\n{output}");
        }
        let data = run.volume("/var/lib/switchyard");
        assert!(
            data.join("switchyard.db").is_file(),
            "{name}: the SQLite file is not in the data volume\n{output}"
        );
        let cached = std::fs::read_dir(run.volume("/var/cache/switchyard"))
            .unwrap()
            .count();
        assert!(
            cached > 0,
            "{name}: no compiled strategy in the cache volume\n{output}"
        );
    }
}
