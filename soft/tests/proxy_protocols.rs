//! The proxy engine end to end over the soft provider (in-process fabric: copies through
//! leased registrations, completions polled from its CQs), with a simulated GPU on each side:
//! the scenario table of `ibnet_testkit::scenarios`, every byte verified on the receiving
//! "GPU". Quick op counts (fewer operations for the slower scenarios) keep CI time modest.

use ibnet_soft::SoftProvider;
use ibnet_testkit::proxy::{run_on, Report, Scenario};

/// Runs `sc` over a freshly opened soft provider, shut down afterwards.
fn run(sc: Scenario) -> Report {
    let dev = SoftProvider::open().expect("open soft0");
    let d = dev.clone();
    let r = run_on(move || d, sc);
    dev.shutdown();
    r
}

ibnet_testkit::proxy_scenario_tests!(run, quick = true);
