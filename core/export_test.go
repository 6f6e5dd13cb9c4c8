package core

// EvalCalls is evalCalls for the tests of package core_test.
var EvalCalls = evalCalls
