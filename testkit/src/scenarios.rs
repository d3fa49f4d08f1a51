//! The one table of proxy scenarios, run per provider.
//!
//! Each provider's test file instantiates the table with
//! [`proxy_scenario_tests!`](crate::proxy_scenario_tests): one `#[test]` per [`Case`], each running the case's runs through that provider's runner
//! ([`proxy::run`](crate::proxy::run) over [`Loopback`](crate::Loopback) in `ibnet-core`, the
//! soft provider in `ibnet-soft`). A slow provider asks for the `quick` op counts (the soft
//! provider moves real bytes between threads; the loopback double copies at post time).

use ibnet_proxy::Protocol;

use crate::proxy::{Report, Scenario};

/// One run of a case: how many subs, how many ops (full and quick).
#[derive(Debug, Clone, Copy)]
pub struct Run {
    /// Sub-operations.
    pub nsubs: usize,
    /// Operations in a full run.
    pub ops: usize,
    /// Operations in a quick run.
    pub quick_ops: usize,
}

/// What a case's largest receive group must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Groups {
    /// Anything.
    Any,
    /// Every sub in one group.
    AllSubs,
    /// Exactly this many.
    Exactly(usize),
}

/// What a case's GDR-copy flush reads must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushReads {
    /// Anything.
    Any,
    /// None (flushes go through the net's `iflush`).
    None,
    /// At least one per operation.
    PerOp,
}

/// One scenario of the table.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The test's name.
    pub name: &'static str,
    /// The scenario (`nsubs` and `ops` come from each run).
    pub sc: Scenario,
    /// The runs, in order.
    pub runs: &'static [Run],
    /// The largest receive group.
    pub groups: Groups,
    /// GDR-copy flush reads.
    pub flush_reads: FlushReads,
    /// Fewest verified payload bytes per operation.
    pub min_bytes_per_op: u64,
}

const fn run(nsubs: usize, ops: usize, quick_ops: usize) -> Run {
    Run {
        nsubs,
        ops,
        quick_ops,
    }
}

const fn case(name: &'static str, sc: Scenario, runs: &'static [Run]) -> Case {
    Case {
        name,
        sc,
        runs,
        groups: Groups::Any,
        flush_reads: FlushReads::Any,
        min_bytes_per_op: 0,
    }
}

const SIMPLE: Scenario = Scenario::simple();

/// Every scenario.
pub const CASES: &[Case] = &[
    Case {
        min_bytes_per_op: 4096,
        ..case("simple_dedicated", SIMPLE, &[run(1, 1000, 1000)])
    },
    Case {
        groups: Groups::Exactly(1), // dedicated connections do not share comms
        ..case(
            "simple_dedicated_four_subs_slice_two_chunk_four",
            Scenario {
                slice: 2,
                chunk: 4,
                max_slices: 4,
                ..SIMPLE
            },
            &[run(4, 1000, 300)],
        )
    },
    case(
        "ll_dedicated",
        Scenario {
            proto: Protocol::Ll,
            ..SIMPLE
        },
        &[run(2, 1000, 1000)],
    ),
    case(
        "ll128_dedicated_host_memory",
        Scenario {
            proto: Protocol::Ll128,
            ..SIMPLE
        },
        &[run(2, 1000, 1000)],
    ),
    case(
        "ll128_gpu_direct_trusts_tail",
        Scenario {
            proto: Protocol::Ll128,
            use_gdr: true,
            ..SIMPLE
        },
        &[run(1, 1000, 300)],
    ),
    Case {
        groups: Groups::AllSubs, // subs on one shared comm form one group
        ..case(
            "simple_shared_buffers_grouped_one_to_eight",
            Scenario {
                shared: true,
                max_slices: 3,
                ..SIMPLE
            },
            &[
                run(1, 1000, 200),
                run(2, 1000, 200),
                run(3, 1000, 200),
                run(5, 1000, 200),
                run(8, 1000, 1000),
            ],
        )
    },
    Case {
        groups: Groups::Exactly(4),
        ..case(
            "shared_buffers_group_limit_follows_max_recvs",
            Scenario {
                shared: true,
                max_recvs: 4,
                max_slices: 2,
                ..SIMPLE
            },
            &[run(6, 200, 200)],
        )
    },
    // 64 KiB network pieces: each op moves 1..=200 KiB in 1..=4 pieces.
    case(
        "registered_buffers_split_on_the_network",
        Scenario {
            shared: true,
            reg: true,
            reg_bytes: 200 << 10,
            max_net_size: 64 << 10,
            ..SIMPLE
        },
        &[run(1, 1000, 1000), run(3, 1000, 200), run(8, 1000, 200)],
    ),
    // 1 MiB pieces of up to 3 MiB: on the soft provider, copies above its direct limit run on
    // its copy-engine workers, completing asynchronously.
    case(
        "registered_buffers_large_pieces_through_the_copy_engine",
        Scenario {
            shared: true,
            reg: true,
            reg_bytes: 3 << 20,
            max_net_size: 1 << 20,
            ..SIMPLE
        },
        &[run(2, 50, 50)],
    ),
    Case {
        flush_reads: FlushReads::None,
        ..case(
            "gpu_direct_receives_flush_with_iflush",
            Scenario {
                use_gdr: true,
                need_flush: true,
                ..SIMPLE
            },
            &[run(1, 1000, 300)],
        )
    },
    Case {
        flush_reads: FlushReads::PerOp, // one GDR-copy read per received SIMPLE step
        ..case(
            "gdr_copy_credits_and_flush_read",
            Scenario {
                use_gdr: true,
                need_flush: true,
                gdc: true,
                gdc_flush: true,
                ..SIMPLE
            },
            &[run(2, 1000, 300)],
        )
    },
    case(
        "gdr_copy_with_shared_buffers",
        Scenario {
            shared: true,
            gdc: true,
            max_slices: 3,
            ..SIMPLE
        },
        &[run(3, 1000, 300)],
    ),
];

/// Runs the case named `name` through `run`, checking every run's report.
///
/// # Panics
/// When no case has that name, or a check fails (these are tests).
pub fn run_case(name: &str, run: impl Fn(Scenario) -> Report, quick: bool) {
    let case = CASES
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no proxy scenario named {name}"));
    for r in case.runs {
        let ops = if quick { r.quick_ops } else { r.ops };
        let rep = run(Scenario {
            nsubs: r.nsubs,
            ops,
            ..case.sc
        });
        let what = format!("{name} with {} subs", r.nsubs);
        assert_eq!(rep.ops, ops, "{what}: operations");
        match case.groups {
            Groups::Any => {}
            Groups::AllSubs => assert_eq!(rep.groups_max, r.nsubs, "{what}: one group"),
            Groups::Exactly(n) => assert_eq!(rep.groups_max, n, "{what}: largest group"),
        }
        match case.flush_reads {
            FlushReads::Any => {}
            FlushReads::None => assert_eq!(rep.flush_reads, 0, "{what}: GDR-copy reads"),
            FlushReads::PerOp => assert!(rep.flush_reads >= ops as u64, "{what}: GDR reads"),
        }
        assert!(
            rep.bytes_verified > case.min_bytes_per_op * ops as u64,
            "{what}: {} bytes verified",
            rep.bytes_verified
        );
    }
}

/// One `#[test]` per [`CASES`] entry, each running [`run_case`] through `$run` (a
/// `fn(Scenario) -> Report`), with the quick op counts when `quick = true`.
#[macro_export]
macro_rules! proxy_scenario_tests {
    ($run:expr, quick = $quick:expr) => {
        $crate::__proxy_scenario_names! {tests[$run, $quick]}
    };
}

/// The names of [`CASES`], handed to `proxy_scenario_tests!` (or, in this crate's tests, to
/// a check that they match the table).
#[doc(hidden)]
#[macro_export]
macro_rules! __proxy_scenario_names {
    ($mode:ident[$($args:tt)*]) => {
        $crate::__proxy_scenario_names! {@$mode[$($args)*]
            simple_dedicated,
            simple_dedicated_four_subs_slice_two_chunk_four,
            ll_dedicated,
            ll128_dedicated_host_memory,
            ll128_gpu_direct_trusts_tail,
            simple_shared_buffers_grouped_one_to_eight,
            shared_buffers_group_limit_follows_max_recvs,
            registered_buffers_split_on_the_network,
            registered_buffers_large_pieces_through_the_copy_engine,
            gpu_direct_receives_flush_with_iflush,
            gdr_copy_credits_and_flush_read,
            gdr_copy_with_shared_buffers
        }
    };
    (@tests[$run:expr, $quick:expr] $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                $crate::scenarios::run_case(stringify!($name), $run, $quick);
            }
        )*
    };
    (@names[] $($name:ident),*) => {
        [$(stringify!($name)),*]
    };
}

#[cfg(test)]
mod tests {
    use super::CASES;

    #[test]
    fn the_macro_names_every_case_once() {
        let names = crate::__proxy_scenario_names!(names[]);
        let table: Vec<&str> = CASES.iter().map(|c| c.name).collect();
        assert_eq!(names.to_vec(), table);
    }
}
