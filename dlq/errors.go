package dlq

import "errors"

// ErrUnwritable marks a Sink error that retrying cannot fix: the record can
// never be written as it is (for example it is larger than the DLQ accepts,
// even split). A DLQ that is down is not unwritable. The consumer engine sets
// such a message aside (unsettled, counted in its Stats, logged once at
// Error) instead of retrying it for ever, so its tenant moves on.
var ErrUnwritable = errors.New("dlq: dead letter cannot be written")
