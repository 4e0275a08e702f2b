// Package wire speaks the Kafka protocol for the reads of package kafka:
// connections to brokers (TLS, SASL, API versions) with requests encoded
// and responses decoded by franz-go's kmsg, the Fetch of one partition,
// the decoder of record batches (message format v2: CRC-32C checked, every
// codec, control batches passed over, null kept apart from empty), and a
// Client that fetches over pooled connections. The source's fetchers, the
// spill log's reader and the DLQ inspector all read records through it.
package wire
