package engine

import "github.com/strata-ai/strata/engine/report"

// The figures the engine reports are package report's plain values.
type (
	StepStats        = report.StepStats
	EvalStats        = report.EvalStats
	HostOptStats     = report.HostOptStats
	PrefetchCounts   = report.PrefetchCounts
	TierStats        = report.TierStats
	Summary          = report.Summary
	DeviceSummary    = report.DeviceSummary
	TierSummary      = report.TierSummary
	HostRegistration = report.HostRegistration
)
