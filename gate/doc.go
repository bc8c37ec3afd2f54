// Package gate holds the value types that admission gates and the routes
// using them share, and the in-process gate: Gate (what decides whether a
// request may go to an (org, model pool) lane now), Permit, Demand and
// Feedback (what passes through it), LaneSnapshot (what it shows),
// LaneConfig (how a lane is tuned), Buckets (a lane's mirrors of its org's
// rate-limit buckets) and Lane, the AIMD controller that implements Gate
// in one process. The shared gate (package shared), the metrics wrapper and
// the sync engine (package dispatch) all build on these types; this
// package imports none of them.
package gate
