//! `picomq`: the one binary. `serve` runs a node (`picomq_node`); the client
//! commands (`cli`), admin and benchmark commands talk HTTP to any server. The
//! commands live in the `picomq` library; this is the process around them.

use clap::{Parser, Subcommand};
use picomq::{cli, config_file, identity, serve};

/// mimalloc instead of glibc malloc: the request path allocates a few dozen small
/// objects per append across threads, where glibc spent ~16% of the server's
/// instructions (benchmarks/results/profile.txt).
#[global_allocator]
static GLOBAL: Allocator = Allocator;

/// mimalloc, except for single allocations of [`HUGE`] or more: nothing in PicoMQ
/// makes one (every buffer is bounded far below), but a decoder that sizes a vector
/// from a count read off the wire can ask for one before it finds the count is a
/// lie. kafka-protocol 0.18 does so for every array of a Kafka request: eleven
/// bytes claiming a billion Metadata topics asked for 72 GB, and a failed
/// allocation aborts the process. Such requests are mapped with MAP_NORESERVE
/// instead: only the pages written are ever committed (no more than the frame's
/// bytes can fill, within --kafka-max-request-bytes), so the decoder reaches the
/// end of the frame and returns its error, and the connection is closed.
struct Allocator;

const HUGE: usize = 1 << 32;

#[cfg(target_os = "linux")]
mod lazy_map {
    use std::ffi::{c_int, c_long, c_void};

    extern "C" {
        fn mmap(
            addr: *mut c_void,
            len: usize,
            prot: c_int,
            flags: c_int,
            fd: c_int,
            off: c_long,
        ) -> *mut c_void;
        fn munmap(addr: *mut c_void, len: usize) -> c_int;
    }
    // The same numbers on x86_64 and aarch64 Linux.
    const PROT_READ_WRITE: c_int = 1 | 2;
    const MAP_PRIVATE_ANONYMOUS_NORESERVE: c_int = 0x02 | 0x20 | 0x4000;

    /// Zeroed, page-aligned, committed only where written; null if refused.
    pub unsafe fn map(len: usize) -> *mut u8 {
        let p = mmap(
            std::ptr::null_mut(),
            len,
            PROT_READ_WRITE,
            MAP_PRIVATE_ANONYMOUS_NORESERVE,
            -1,
            0,
        );
        if p as isize == -1 {
            std::ptr::null_mut()
        } else {
            p.cast()
        }
    }

    pub unsafe fn unmap(p: *mut u8, len: usize) {
        munmap(p.cast(), len);
    }
}

unsafe impl std::alloc::GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        #[cfg(target_os = "linux")]
        if layout.size() >= HUGE && layout.align() <= 4096 {
            return lazy_map::map(layout.size());
        }
        mimalloc::MiMalloc.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        #[cfg(target_os = "linux")]
        if layout.size() >= HUGE && layout.align() <= 4096 {
            return lazy_map::map(layout.size());
        }
        mimalloc::MiMalloc.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        #[cfg(target_os = "linux")]
        if layout.size() >= HUGE && layout.align() <= 4096 {
            return lazy_map::unmap(ptr, layout.size());
        }
        mimalloc::MiMalloc.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if layout.size() < HUGE && new_size < HUGE {
            return mimalloc::MiMalloc.realloc(ptr, layout, new_size);
        }
        let new = std::alloc::Layout::from_size_align_unchecked(new_size, layout.align());
        let p = self.alloc(new);
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        p
    }
}

extern "C" {
    /// mimalloc's option setter (linked in by the `mimalloc` crate).
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    /// Runs mimalloc's deferred work, including purges whose delay has passed.
    fn mi_collect(force: bool);
    /// libc's `prctl(2)`.
    fn prctl(option: std::ffi::c_int, ...) -> std::ffi::c_int;
}

/// With its defaults mimalloc held freed memory: creating 30,000 streams peaked at
/// 311 MB RSS against glibc's 204 MB. Committing arena memory on demand and returning
/// freed pages soon after brings it down. "Soon" is 250 ms rather than at once:
/// returning every freed page immediately cost ~7% of the server's CPU under load
/// (madvise, TLB shootdowns, then page faults to take the pages back).
///
/// No transparent huge pages: mimalloc v3 advises them on its arenas, so every page
/// it took back after a purge was faulted in as a fresh 2 MiB page and zeroed. While
/// creating streams, `clear_page_erms` under those faults was 25% of the server's
/// CPU, and RSS peaked at 884 MiB for 100,000 streams (576 MiB without). The option
/// stops further advice; the prctl covers the arena mimalloc mapped before `main`.
///
/// Option numbers from mimalloc v3's `mimalloc.h`: `mi_option_arena_eager_commit` =
/// 4, `mi_option_purge_delay` = 15, `mi_option_allow_thp` = 43. mimalloc's own
/// `MIMALLOC_*` environment variables still win when set.
fn tune_allocator() {
    const ARENA_EAGER_COMMIT: std::ffi::c_int = 4;
    const PURGE_DELAY: std::ffi::c_int = 15;
    const ALLOW_THP: std::ffi::c_int = 43;
    const PURGE_DELAY_MS: std::ffi::c_long = 250;
    const PR_SET_THP_DISABLE: std::ffi::c_int = 41;
    let unset = |name: &str| std::env::var_os(name).is_none();
    // SAFETY: plain option setters on a static allocator, and a prctl that only sets
    // a flag on this process, called before the runtime starts.
    unsafe {
        if unset("MIMALLOC_ARENA_EAGER_COMMIT") {
            mi_option_set(ARENA_EAGER_COMMIT, 0);
        }
        if unset("MIMALLOC_PURGE_DELAY") {
            mi_option_set(PURGE_DELAY, PURGE_DELAY_MS);
        }
        if unset("MIMALLOC_ALLOW_THP") {
            mi_option_set(ALLOW_THP, 0);
            let _ = prctl(
                PR_SET_THP_DISABLE,
                1 as std::ffi::c_ulong,
                0 as std::ffi::c_ulong,
                0 as std::ffi::c_ulong,
                0 as std::ffi::c_ulong,
            );
        }
    }
}

/// mimalloc carries out a delayed purge only when the allocator is next busy, so a
/// server that goes quiet would keep its freed pages: after a million streams went
/// dormant, RSS stayed at 324 MiB with the 250 ms delay against 85 MiB with none.
/// Once a second, this thread lets the expired purges happen (cheap when none are
/// due).
fn start_allocator_collector() {
    let spawned = std::thread::Builder::new()
        .name("picomq-mi-collect".into())
        .spawn(|| loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            // SAFETY: mimalloc's collection entry point, callable from any thread.
            unsafe { mi_collect(false) };
        });
    if let Err(e) = spawned {
        eprintln!("picomq: allocator collector not started: {e}");
    }
}

#[derive(Parser)]
#[command(
    name = "picomq",
    version,
    about = "Durable, real-time streams over HTTP, stored in object storage"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (defaults: 127.0.0.1:4437, data in ./picomq-data).
    Serve(Box<serve::ServeArgs>),
    /// The binding of a store and its metadata: show it, rebind them deliberately,
    /// or move a single node's streams into a cluster (Postgres).
    Store {
        #[command(subcommand)]
        command: identity::StoreCommand,
    },
    /// Benchmark any Durable Streams server (appends, live and catch-up reads, costs).
    Bench(Box<picomq_bench::BenchArgs>),
    #[command(flatten)]
    Client(Box<cli::ClientCommand>),
}

fn main() -> std::process::ExitCode {
    tune_allocator();
    let cli: Cli = config_file::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match cli.command {
        Command::Serve(args) => {
            start_allocator_collector();
            runtime.block_on(serve::run(*args))
        }
        Command::Bench(args) => {
            // The bench logs nothing. Without a subscriber, every span h2 and hyper
            // open per request would also go through the `log` crate (sqlx turns on
            // tracing's `log` feature): 2-3% of the client's CPU.
            let _ =
                tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::new());
            runtime.block_on(picomq_bench::run(*args))
        }
        Command::Store { command } => runtime.block_on(identity::run(command)),
        Command::Client(command) => runtime.block_on(cli::run(*command)),
    }
}
