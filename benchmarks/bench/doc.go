// Package bench measures ratewindow and other Go rate limiters side by side
// on one Redis: decisions per second with latency, allocations and CPU per
// decision; Redis memory per key; and the worst count admitted in any one
// second for a limit of 100 per second. The contenders run in turn, in
// rounds, so that machine noise hits them alike.
//
// The command github.com/ratewindow/ratewindow/benchmarks/cmd/rwbench runs
// it and writes results/results.md and results/results.svg.
package bench
