//! A process that exits without closing an emulated NIC whose queues are in (simulated) GPU memory, with a
//! WQE in flight, ends with its own exit code. A test binary without the test harness: it runs itself again
//! as the child (`GDAKI_EXIT_CHILD` set), which exits from the middle of its work.

mod emu_util;

use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use emu_util::*;
use gdaki::mem::{HostQueueMemory, MemKind};
use gdaki::nic::emu::{EmuConfig, SimGpu};

fn child() -> ! {
    let cfg = EmuConfig {
        queue_mem: Arc::new(HostQueueMemory),
        gpu: Some(Arc::new(SimGpu::new().expect("simulated GPU"))),
        queues: MemKind::Gpu,
        wire: None,
        blueflame: true,
    };
    let p = Pair::with_config(cfg, 64, 64);
    let mut sq = Sq::new(&p.a);
    let at = sq.put(&sq.nop(SIGNALED));
    sq.dbrec();
    sq.doorbell(at);
    std::mem::forget(p);
    std::process::exit(7);
}

fn main() -> ExitCode {
    if std::env::var_os("GDAKI_EXIT_CHILD").is_some() {
        child();
    }
    let mut c = Command::new(std::env::current_exe().expect("own path"))
        .env("GDAKI_EXIT_CHILD", "1")
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the child");
    let start = Instant::now();
    loop {
        if let Some(s) = c.try_wait().expect("wait for the child") {
            if s.code() == Some(7) {
                println!("test a_process_that_exits_without_closing_ends ... ok");
                return ExitCode::SUCCESS;
            }
            eprintln!("the child ended with {s}, not its own exit code 7");
            return ExitCode::FAILURE;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = c.kill();
            eprintln!("the child did not exit within 30 s");
            return ExitCode::FAILURE;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
