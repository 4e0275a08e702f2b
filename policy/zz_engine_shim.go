package policy

import (
	"context"
	"time"
)

// TEMPORARY: the engine branch's stand-ins for the policy API being built
// on the policy-core branch; removed when that branch is merged.

type RetryDecision struct {
	Retry bool
	Delay time.Duration
	Stop  StopReason
}

type StopReason uint8

const (
	StopNone StopReason = iota
	StopPermanent
	StopAttempts
	StopOpen
	StopBudget
)

func (h *Guard) AttemptTimeout() time.Duration            { return h.r.originalCopy.AttemptTimeout }
func (h *Guard) Concurrency(def int) int                  { return def }
func (h *Guard) Weight() int                              { return 1 }
func (h *Guard) Latency() time.Duration                   { return h.Stats().Latency }
func (h *Guard) BeforeAttempt(context.Context, int) error { return nil }
