//! The proxy engine end to end with a simulated GPU over the loopback double: the scenario
//! table of `ibnet_testkit::scenarios` (SIMPLE, LL and LL128; dedicated and shared buffers;
//! grouped multi-receives over shared comms; registered user buffers split on the network;
//! GPU-direct with `iflush` and GDR-copy credits/flush), full op counts, every byte verified.

ibnet_testkit::proxy_scenario_tests!(ibnet_testkit::proxy::run, quick = false);
