//! The examples' live dashboard (cargo feature `admin`): an admin server over their pools on
//! 127.0.0.1, with a fresh token for the page's buttons, printed for the user.

use std::hash::{BuildHasher, Hasher};
use std::io::IsTerminal;

use prometheus_parking_lot::admin::{Admin, AdminServer, AdminSettings};
use prometheus_parking_lot::config::Secret;
use prometheus_parking_lot::core::PoolControl;

/// Pools to serve, each by name with how to add it to the admin server.
pub type Pools = Vec<(String, Box<dyn FnOnce(Admin) -> Admin>)>;

/// A fresh token for the dashboards' buttons (or the one this process was given in
/// `PL_EXAMPLE_TOKEN`, so that a cluster's processes share one).
pub fn token() -> String {
    std::env::var("PL_EXAMPLE_TOKEN").unwrap_or_else(|_| {
        let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
        seed.write_u64(std::process::id().into());
        format!("{:016x}", seed.finish())
    })
}

/// Serves `pools` on 127.0.0.1:`port` (port 0: a free one), with `token` for its buttons.
pub fn serve(
    port: u16,
    token: &str,
    pools: Pools,
) -> Result<AdminServer, prometheus_parking_lot::PoolError> {
    let mut admin = Admin::new(AdminSettings {
        bind: ([127, 0, 0, 1], port).into(),
        token: Some(Secret::new(token)),
        ..AdminSettings::default()
    });
    for (_, add) in pools {
        admin = add(admin);
    }
    admin.serve()
}

/// Serves `pools` on 127.0.0.1:7480 and prints where, with a fresh token.
pub fn start(pools: Pools) -> Option<AdminServer> {
    let token = token();
    let names: Vec<String> = pools.iter().map(|(name, _)| name.clone()).collect();
    match serve(AdminSettings::DEFAULT_PORT, &token, pools) {
        Ok(server) => {
            println!(
                "dashboard of {}: {}  (token for its buttons: {token})",
                names.join(", "),
                server.url()
            );
            Some(server)
        }
        Err(error) => {
            println!("(no dashboard: {error})");
            None
        }
    }
}

/// One pool for [`start`].
pub fn pool(name: &str, pool: impl Into<PoolControl>) -> (String, Box<dyn FnOnce(Admin) -> Admin>) {
    let owned = name.to_owned();
    let pool = pool.into();
    (
        name.to_owned(),
        Box::new(move |admin: Admin| admin.with_pool(owned, pool)),
    )
}

/// At a terminal, keeps the dashboard up until the user presses Enter; elsewhere (a script,
/// CI) returns at once.
pub fn keep_open(server: Option<AdminServer>) {
    let Some(server) = server else {
        return;
    };
    if !std::io::stdin().is_terminal() {
        return;
    }
    println!(
        "\nthe dashboard stays up at {}; press Enter to stop",
        server.url()
    );
    let _ = std::io::stdin().read_line(&mut String::new());
}
