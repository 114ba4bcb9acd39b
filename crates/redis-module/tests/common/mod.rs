//! What the module's tests share: the module as this build made it, the `redis-server` to load
//! it into, and a free port for it (each test file uses what it needs).

use std::net::TcpListener;
use std::path::{Path, PathBuf};

use tollgate::conformance::skipped;

/// The module's shared library as this test's build made it: beside the test binary
/// (`target/<profile>/deps`, where `cargo test` builds it; `cargo build` copies it up a level),
/// asserted present.
pub fn module_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let module = exe.parent().expect("deps dir").join(format!(
        "{}tollgate_redis_module{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    assert!(
        module.exists(),
        "{} missing: the module is built with this test",
        module.display()
    );
    module
}

/// The `redis-server` to start (`TOLLGATE_REDIS_SERVER`, else Debian's); `None`, said loudly
/// (a failure under `CI=true`), when there is none.
#[allow(dead_code)]
pub fn redis_server() -> Option<String> {
    let redis_server = std::env::var("TOLLGATE_REDIS_SERVER")
        .unwrap_or_else(|_| "/usr/bin/redis-server".to_owned());
    if Path::new(&redis_server).exists() {
        return Some(redis_server);
    }
    skipped(&format!(
        "no redis-server at {redis_server} (set TOLLGATE_REDIS_SERVER)"
    ));
    None
}

#[allow(dead_code)]
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}
