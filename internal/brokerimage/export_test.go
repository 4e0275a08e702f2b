package brokerimage

// Exported for the external tests that need Docker.
var (
	BuildForTest       = build
	PruneOthersForTest = pruneOthers
)
