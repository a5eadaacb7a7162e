//! The runtime's safe wrapper over MLX's distributed API
//! (`archgen_runtime::distributed`), on two ranks of the ring backend over
//! loopback, started by mlx.launch from the project venv: `all_sum` and
//! `all_gather` of known arrays, checked on every rank; and the errors of
//! a backend that cannot start.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use archgen_runtime::distributed::{Backend, Group};
use archgen_runtime::{Array, Dtype};

/// The venv's `mlx.launch`.
fn mlx_launch() -> PathBuf {
    let python = archgen_tests::venv_python();
    python.with_file_name("mlx.launch")
}

/// `n` consecutive free TCP ports on loopback (the ring backend listens on
/// `start + rank`), so tests running at once do not collide.
pub fn free_ports(n: u16) -> u16 {
    for _ in 0..100 {
        let Ok(first) = std::net::TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(start) = first.local_addr().map(|a| a.port()) else {
            continue;
        };
        if start > u16::MAX - n {
            continue;
        }
        let rest: Vec<_> = (1..n)
            .map(|i| std::net::TcpListener::bind(("127.0.0.1", start + i)))
            .collect();
        if rest.iter().all(Result::is_ok) {
            return start;
        }
    }
    panic!("no {n} consecutive free ports on 127.0.0.1");
}

/// Runs `cmd`, killing it after `limit`; returns (success, stdout + stderr).
fn run_bounded(mut cmd: Command, limit: Duration) -> (bool, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).ok();
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut err, &mut s).ok();
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = format!(
        "{}{}",
        out_t.join().unwrap_or_default(),
        err_t.join().unwrap_or_default()
    );
    match status {
        Some(s) => (s.success(), text),
        None => panic!(
            "{cmd:?} did not end within {} s and was killed; its output:\n{text}",
            limit.as_secs()
        ),
    }
}

#[test]
fn all_sum_and_all_gather_agree_on_two_ring_ranks() {
    let port = free_ports(2);
    // Each rank writes its verdict to a file here: mlx.launch may drop a
    // rank's last output lines (it stops reading a pipe when the process
    // has exited).
    let reports = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(mlx_launch());
    cmd.args(["--backend", "ring", "-n", "2", "--starting-port"])
        .arg(port.to_string())
        .arg("--env")
        .arg(format!("{REPORT_DIR}={}", reports.path().display()))
        .arg("--")
        .arg(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "rank_body",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
    let (ok, text) = run_bounded(cmd, Duration::from_secs(120));
    assert!(ok, "mlx.launch of two ranks failed:\n{text}");
    for rank in 0..2 {
        let report = std::fs::read_to_string(reports.path().join(format!("rank-{rank}")))
            .unwrap_or_else(|e| panic!("rank {rank} wrote no report ({e}):\n{text}"));
        assert_eq!(
            report,
            format!("rank {rank} of 2: all_sum and all_gather ok"),
            "{text}"
        );
    }
}

/// One rank's checks; run under mlx.launch by the test above (it needs
/// MLX_RANK and MLX_HOSTFILE).
#[test]
#[ignore = "one rank of all_sum_and_all_gather_agree_on_two_ring_ranks, started by mlx.launch"]
fn rank_body() {
    let g = Group::init(Backend::Ring).expect("ring init under mlx.launch");
    assert_eq!(g.size(), 2, "{g:?}");
    let r = g.rank();
    let rf = r as f32;
    // all_sum: rank r holds [1 + r, 2, 3 (r + 1)] -> [3, 4, 9].
    let x = Array::from_slice(&[1.0 + rf, 2.0, 3.0 * (rf + 1.0)], &[3]);
    let s = g.all_sum(&x).expect("all_sum");
    s.eval().expect("all_sum evaluates");
    assert_eq!(s.as_slice::<f32>(), &[3.0, 4.0, 9.0], "rank {r}");
    // bf16 stays bf16 (the sharded projections' dtype).
    let xb = x.as_dtype(Dtype::Bfloat16).unwrap();
    let sb = g.all_sum(&xb).expect("all_sum bf16");
    assert_eq!(sb.dtype(), Dtype::Bfloat16);
    let sb = sb.as_dtype(Dtype::Float32).unwrap();
    sb.eval().unwrap();
    assert_eq!(sb.as_slice::<f32>(), &[3.0, 4.0, 9.0], "rank {r}");
    // all_gather: rank r holds [[10 r, 10 r + 1]] -> [[0, 1], [10, 11]].
    let y = Array::from_slice(&[10 * r, 10 * r + 1], &[1, 2]);
    let gathered = g.all_gather(&y).expect("all_gather");
    gathered.eval().expect("all_gather evaluates");
    assert_eq!(gathered.shape(), &[2, 2]);
    assert_eq!(gathered.as_slice::<i32>(), &[0, 1, 10, 11], "rank {r}");
    let dir = std::env::var_os(REPORT_DIR).expect("the launching test sets the report directory");
    std::fs::write(
        PathBuf::from(dir).join(format!("rank-{r}")),
        format!("rank {r} of 2: all_sum and all_gather ok"),
    )
    .expect("report written");
}

/// Where each rank of [`rank_body`] writes its verdict.
const REPORT_DIR: &str = "ARCHGEN_DISTRIBUTED_TEST_REPORTS";

#[test]
fn a_backend_that_cannot_start_is_an_error_not_a_panic() {
    // This libmlx is the CPU wheel: no NCCL.
    let e = Group::init(Backend::Nccl).expect_err("NCCL is not in the CPU wheel");
    assert!(e.what().contains("nccl"), "{}", e.what());
    // The ring backend without the launcher's environment.
    assert!(std::env::var_os("MLX_HOSTFILE").is_none());
    let e = Group::init(Backend::Ring).expect_err("no MLX_HOSTFILE");
    assert!(
        e.what().starts_with("initialising the ring backend: "),
        "{}",
        e.what()
    );
    assert_eq!(
        Backend::parse("tcp").unwrap_err(),
        "unknown distributed backend 'tcp': expected one of ring, nccl, mpi"
    );
}
