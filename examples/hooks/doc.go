// Command hooks shows two extension points on an in-process NATS server:
// policy.Admit as a per-tenant quota (a token bucket per tenant, built in
// scope.Options.Shape), and OnEvent hooks logged with log/slog. acme may
// run 5 messages a second, globex 50: acme's extra messages are not
// dropped or failed, they wait in its lane until its quota admits them,
// while globex goes at full speed.
//
//	go run ./examples/hooks
package main
