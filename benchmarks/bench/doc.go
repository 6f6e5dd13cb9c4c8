// Package bench measures ratewindow and other Go rate limiters side by side
// on one Redis: decisions per second with latency, allocations and CPU per
// decision; Redis memory per key; and the worst count admitted in any one
// second for a limit of 100 per second. For the throughput, each contender
// runs in a process of its own (SliceChild) against a flushed Redis, the
// rounds interleaved so that machine noise hits them alike; the tables give
// the median and the spread of the rounds, and Redis's own time a call from
// INFO commandstats. The throughput grid runs again on a Redis Cluster of
// three masters that the program starts on loopback (StartCluster), every
// contender through a cluster client, the server's figures summed over the
// masters.
//
// The command github.com/ratewindow/ratewindow/benchmarks/cmd/rwbench runs
// it and writes results/results.md and results/results.svg.
package bench
