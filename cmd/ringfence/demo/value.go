package demo

import (
	"bytes"
	"strconv"
)

// Message values are "tenant|id|kind|stamp": the handler and the
// dead-letter count read the real tenant and the id from the value, so they
// work the same whatever key the engine's tenant function returns, and the
// stamp (Unix nanoseconds when the message was produced) gives the
// end-to-end latency on whichever process handles it.
const (
	kindOK     = 'o'
	kindPoison = 'p'
)

func encodeValue(tenant string, id int, kind byte, stamp int64) []byte {
	b := make([]byte, 0, len(tenant)+32)
	b = append(b, tenant...)
	b = append(b, '|')
	b = strconv.AppendInt(b, int64(id), 10)
	b = append(b, '|', kind, '|')
	return strconv.AppendInt(b, stamp, 10)
}

// decodedValue is a decoded message value.
type decodedValue struct {
	tenant string
	id     int
	kind   byte
	stamp  int64 // Unix ns at produce time
}

// decodeValue parses a value written by encodeValue. It fails closed: a
// value with a '|' in the tenant (never produced by the demo) is refused
// rather than attributed to a wrong tenant.
func decodeValue(v []byte) (decodedValue, bool) {
	var f [4][]byte
	rest := v
	for i := range 3 {
		j := bytes.IndexByte(rest, '|')
		if j < 0 {
			return decodedValue{}, false
		}
		f[i], rest = rest[:j], rest[j+1:]
	}
	f[3] = rest
	if len(f[0]) == 0 || bytes.IndexByte(f[3], '|') >= 0 || len(f[2]) != 1 || (f[2][0] != kindOK && f[2][0] != kindPoison) {
		return decodedValue{}, false
	}
	id, ok := decimal(f[1])
	if !ok || id > maxMessages {
		return decodedValue{}, false
	}
	stamp, ok := decimal(f[3])
	if !ok {
		return decodedValue{}, false
	}
	return decodedValue{tenant: string(f[0]), id: int(id), kind: f[2][0], stamp: stamp}, true
}

// decimal parses a non-negative decimal int64 of plain digits (no sign, no
// leading zeros but "0" itself), so that every accepted value re-encodes to
// the same bytes.
func decimal(b []byte) (int64, bool) {
	if len(b) == 0 || (len(b) > 1 && b[0] == '0') {
		return 0, false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(b), 10, 64) // refuses overflow
	return n, err == nil
}
