//! Tensor-parallel runs: `archgen launch` starts the ranks, and each rank
//! joins MLX's distributed group from the environment the launcher (or
//! `mlx.launch`) writes and loads only its slices of the checkpoint.
//!
//! The environment is `mlx.launch`'s (mlx 0.32.2,
//! `mlx/_distributed_utils/launch.py`), so either launcher starts archgen
//! ranks: every rank gets `MLX_RANK`; the ring backend reads `MLX_HOSTFILE`,
//! a file holding a JSON list with one `["ip:port"]` list per rank, ports
//! counting up from `--starting-port`; NCCL reads `MLX_WORLD_SIZE`,
//! `NCCL_HOST_IP`, `NCCL_PORT`, one GPU per rank through
//! `CUDA_VISIBLE_DEVICES`.

use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use archgen_runtime::distributed::{Backend, Group};

use crate::args::{LaunchArgs, LaunchBackend};

/// The group this process is a rank of (set once by [`join_from_env`]).
static RANK: OnceLock<Option<Group>> = OnceLock::new();

/// The distributed group of this process when a launcher started it.
pub(crate) fn group() -> Option<&'static Group> {
    RANK.get().and_then(|g| g.as_ref())
}

/// Set by `archgen launch` so its ranks need not guess the backend.
const BACKEND_VAR: &str = "ARCHGEN_DISTRIBUTED_BACKEND";

/// Joins the group the environment describes when `MLX_RANK` is set (the
/// process was started by `archgen launch` or `mlx.launch`); `Ok(None)`
/// otherwise. The backend is `ARCHGEN_DISTRIBUTED_BACKEND` when set, else
/// the one whose variables are present (NCCL's `NCCL_HOST_IP`, the ring's
/// `MLX_HOSTFILE`).
pub(crate) fn join_from_env() -> Result<Option<&'static Group>, String> {
    if let Some(g) = RANK.get() {
        return Ok(g.as_ref());
    }
    let Some(rank) = std::env::var_os("MLX_RANK") else {
        let _ = RANK.set(None);
        return Ok(None);
    };
    let rank = rank.to_string_lossy().into_owned();
    let backend = match std::env::var(BACKEND_VAR) {
        Ok(name) => Backend::parse(&name).map_err(|e| format!("{BACKEND_VAR}: {e}"))?,
        Err(_) if std::env::var_os("NCCL_HOST_IP").is_some() => Backend::Nccl,
        Err(_) if std::env::var_os("MLX_HOSTFILE").is_some() => Backend::Ring,
        Err(_) => {
            return Err(format!(
                "MLX_RANK={rank} is set but neither MLX_HOSTFILE (ring) nor NCCL_HOST_IP (nccl) \
                 is: start the ranks with `archgen launch` or `mlx.launch`, or unset MLX_RANK"
            ))
        }
    };
    let joined = Group::init(backend).map_err(|e| format!("rank {rank}: {}", e.what()))?;
    let _ = RANK.set(Some(joined));
    Ok(group())
}

/// One started rank.
struct Rank {
    rank: usize,
    child: Child,
    status: Option<ExitStatus>,
    /// Stopped by the launcher (after another rank failed, or on timeout).
    stopped: bool,
    stderr: Option<std::thread::JoinHandle<()>>,
}

/// A temporary file removed when dropped (the ring hostfile).
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("was killed by signal {signal}");
        }
    }
    match status.code() {
        Some(code) => format!("exited with status {code}"),
        None => "ended without a status".into(),
    }
}

/// `archgen launch`: starts `-n` ranks of this executable running the
/// command after `--`, with the environment `mlx.launch` writes, and waits.
/// Rank 0's stdout is this process's stdout (it alone prints and writes
/// output files); every rank's stderr comes through prefixed `[rank R]`.
/// When a rank fails, the others get `--grace` seconds to end on their own
/// (MLX reports a closed peer as an error), then are killed; `--timeout`
/// bounds the whole run. Either way every rank's end is reported.
pub(crate) fn launch(args: &LaunchArgs) -> Result<(), String> {
    if args.n == 0 {
        return Err("-n 0: a launch needs at least one rank".into());
    }
    let seconds = |flag: &str, v: f64| -> Result<Duration, String> {
        Duration::try_from_secs_f64(v)
            .map_err(|_| format!("{flag} {v}: expected a number of seconds, 0 or more"))
    };
    let grace = seconds("--grace", args.grace)?;
    let timeout = args.timeout.map(|t| seconds("--timeout", t)).transpose()?;
    let hosts: Vec<&str> = args.hosts.split(',').map(str::trim).collect();
    for h in &hosts {
        let ip: IpAddr = h.parse().map_err(|_| {
            format!(
                "--hosts: '{h}' is not an IP address (the ring backend connects to IPs, as \
                 mlx.launch requires)"
            )
        })?;
        if !ip.is_loopback() {
            return Err(format!(
                "--hosts: {h} is not this machine's loopback address: archgen launch starts \
                 ranks on this machine only; start ranks on other hosts with mlx.launch (its \
                 ranks run archgen the same way)"
            ));
        }
    }
    let world = hosts.len() * args.n;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find archgen itself: {e}"))?;
    let backend = match args.backend {
        LaunchBackend::Ring => Backend::Ring,
        LaunchBackend::Nccl => Backend::Nccl,
    };
    // The ring hostfile: one ["ip:port"] per rank, ports counting up. One
    // rank is an unsharded run: it gets no distributed environment (the
    // ring backend cannot form a ring of one; mlx.launch writes an empty
    // hostfile then).
    let hostfile = match backend {
        _ if world == 1 => None,
        Backend::Ring => {
            let mut ranks = Vec::with_capacity(world);
            let mut port = u32::from(args.starting_port);
            for h in &hosts {
                for _ in 0..args.n {
                    if port > u32::from(u16::MAX) {
                        return Err(format!(
                            "--starting-port {}: {world} ranks need ports up to {port}, beyond 65535",
                            args.starting_port
                        ));
                    }
                    ranks.push(vec![format!("{h}:{port}")]);
                    port += 1;
                }
            }
            let json = serde_json::to_string(&ranks).expect("strings serialize");
            let path = std::env::temp_dir().join(format!(
                "archgen-launch-{}-{}.json",
                std::process::id(),
                args.starting_port
            ));
            std::fs::write(&path, json + "\n")
                .map_err(|e| format!("cannot write the hostfile {}: {e}", path.display()))?;
            Some(TempFile(path))
        }
        Backend::Nccl | Backend::Mpi => None,
    };
    let mut ranks: Vec<Rank> = Vec::with_capacity(world);
    for rank in 0..world {
        let mut cmd = Command::new(&exe);
        cmd.args(&args.command)
            .env("MLX_RANK", rank.to_string())
            .env(BACKEND_VAR, backend.name())
            .stdin(Stdio::null())
            .stdout(if rank == 0 {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::piped());
        match (&hostfile, backend) {
            _ if world == 1 => {
                cmd.env_remove("MLX_RANK").env_remove(BACKEND_VAR);
            }
            (Some(file), _) => {
                cmd.env("MLX_HOSTFILE", &file.0);
            }
            (None, _) => {
                cmd.env("MLX_WORLD_SIZE", world.to_string())
                    .env("NCCL_HOST_IP", hosts[0])
                    .env("NCCL_PORT", args.nccl_port.to_string())
                    .env("CUDA_VISIBLE_DEVICES", (rank % args.n).to_string());
            }
        }
        match cmd.spawn() {
            Ok(mut child) => {
                let stderr = child.stderr.take().map(|pipe| {
                    std::thread::spawn(move || {
                        for line in BufReader::new(pipe).lines() {
                            let Ok(line) = line else { break };
                            let mut err = std::io::stderr().lock();
                            let _ = writeln!(err, "[rank {rank}] {line}");
                        }
                    })
                });
                ranks.push(Rank {
                    rank,
                    child,
                    status: None,
                    stopped: false,
                    stderr,
                });
            }
            Err(e) => {
                for r in &mut ranks {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                }
                return Err(format!("cannot start rank {rank} ({}): {e}", exe.display()));
            }
        }
    }
    let start = Instant::now();
    let mut first_failure: Option<(usize, Instant)> = None;
    let mut timed_out = false;
    loop {
        for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
            if let Ok(Some(status)) = r.child.try_wait() {
                r.status = Some(status);
                if !status.success() && first_failure.is_none() {
                    first_failure = Some((r.rank, Instant::now()));
                }
            }
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            break;
        }
        let give_up = match (first_failure, timeout) {
            (Some((_, at)), _) if at.elapsed() >= grace => true,
            (_, Some(t)) if start.elapsed() >= t => {
                timed_out = true;
                true
            }
            _ => false,
        };
        if give_up {
            for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
                let _ = r.child.kill();
                r.stopped = true;
                r.status = r.child.wait().ok();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for r in &mut ranks {
        if let Some(t) = r.stderr.take() {
            let _ = t.join();
        }
    }
    drop(hostfile);
    let mut failures = Vec::new();
    for r in &ranks {
        match (r.status, r.stopped) {
            (_, true) => failures.push(format!(
                "rank {} was stopped by the launcher ({})",
                r.rank,
                match (timed_out, first_failure) {
                    (true, _) => format!("--timeout {} s passed", args.timeout.unwrap_or_default()),
                    (false, Some((f, _))) => format!(
                        "it was still running {} s after rank {f} failed",
                        args.grace
                    ),
                    (false, None) => "no reason".into(),
                }
            )),
            (Some(s), false) if s.success() => {}
            (Some(s), false) => failures.push(format!("rank {} {}", r.rank, describe(s))),
            (None, false) => failures.push(format!("rank {} has no exit status", r.rank)),
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "launch of {world} ranks ({} backend) failed: {}",
            backend.name(),
            failures.join("; ")
        ))
    }
}
