package console

import "context"

// Sample takes one sample for the plots now, as the sampler does every
// HistoryEvery.
func (c *Console) Sample() { c.sample(context.Background()) }
