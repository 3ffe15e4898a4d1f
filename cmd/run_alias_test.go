package cmd

import (
	"context"
	"io"
	"time"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/data"
	"github.com/strata-ai/strata/engine"
	"github.com/strata-ai/strata/engine/report"
	trainrun "github.com/strata-ai/strata/run"
)

// The names the tests of cmd use for what moved to the run package.
type stepLine = trainrun.StepLine

const lockFileName = trainrun.LockFileName

var (
	identifyData = trainrun.IdentifyData
	dataChange   = trainrun.DataChange
)

type stepTime = trainrun.StepTime

func writeRunOut(dir string, e *engine.Engine, sum report.Summary, elapsed time.Duration, ev *trainrun.EvalLine, st stepTime, w io.Writer) error {
	return trainrun.WriteOutputs(context.Background(), dir, e, sum, elapsed, ev, st, w)
}

// runData is a run's training data, for epochSteps.
type runData struct{ train *data.TrainData }

func epochSteps(d *runData, cfg *config.Config, epochs int) (int, error) {
	return trainrun.NewData(d.train).EpochSteps(cfg, epochs)
}
