// Package redistest gives tests a Redis: a shared real redis-server, dedicated
// servers a test may kill and restart, a three-master Redis Cluster, a master with
// a replica behind a Sentinel, a silent listener for timeout tests, and miniredis
// for unit tests that need a controlled clock.
//
// Every package that uses [New] or [NewCluster] calls [Main] from its TestMain, so
// the servers shared by the test binary are stopped when its tests are done:
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
//
// Servers are started from the redis-server, redis-cli and redis-sentinel binaries
// found in PATH, each on a free port of 127.0.0.1, in a temporary directory, with
// persistence off (--save "" --appendonly no), bound to 127.0.0.1 only. They run in
// their own process group, which is killed when they are stopped; on Linux they are
// also killed when the test binary dies. Their output goes to a log file that is
// printed when a server does not become ready within a few seconds.
//
// Environment:
//
//   - REDIS_ADDR: the host:port of a Redis that [New] returns instead of starting
//     one. Tests share it with whatever else uses it: they isolate themselves by key
//     prefix, and nothing here ever flushes it.
//   - REDIS_CLUSTER_ADDRS: comma-separated host:port seeds of a Redis Cluster that
//     [NewCluster] returns instead of starting one.
//   - RATEWINDOW_REQUIRE_REDIS=1: a missing binary fails the test (t.Fatal) instead
//     of falling back to miniredis ([New]) or skipping the test ([Start],
//     [NewCluster], [NewSentinel]). CI sets it, so no test silently skips there.
//
// Both addresses must be loopback addresses (127.0.0.0/8, ::1 or localhost): tests
// write keys, and a variable as common as REDIS_ADDR may point at a server that is
// not meant for tests.
package redistest
