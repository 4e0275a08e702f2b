// Command shaping gives premium tenants a longer deadline than everyone
// else, with scope.Options.Shape, on an in-process Kafka (franz-go kfake).
// Each tenant asks for a report that takes 300ms to build: the premium
// tenant's 1s deadline lets it finish; the standard tenant's 100ms deadline
// cuts it off, and after its attempts the report is dead-lettered (its next
// message succeeded, so the failure is the report's own).
//
//	go run ./examples/shaping
package main
