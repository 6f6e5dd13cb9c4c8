// Package admin lets the people running a service operate its rate limits
// live: see a key's usage under a rule, reset, block or unblock it, give it
// limits of its own (an override) and see the keys denied most, on every
// replica at once.
//
// [New] serves these operations as JSON, with one small page to look at a
// key and at the keys denied most, behind an authorization function it
// cannot be built without. [Ops] runs the same operations for other front
// ends; the ratewindow command is one.
//
// The operations find a rule by name among the rules the application
// published to Redis (core.Limiter.Publish), so the handler may run in a
// process of its own, with a Limiter on the application's Redis and prefix.
// Keys are the key function's results, without the rule's name.
package admin
