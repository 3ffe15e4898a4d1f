package monitor_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/strata-ai/strata/monitor"
)

// Example writes two steps' loss and learning rate as DeepSpeed's
// csv_monitor does, one file per tag, and prints the learning rate's file.
func Example() {
	dir, err := os.MkdirTemp("", "monitor-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)

	var w monitor.Writer
	w, err = monitor.OpenCSV(dir, 0)
	if err != nil {
		fmt.Println(err)
		return
	}
	for step, loss := range []float64{5.5, 4.25} {
		samples := int64(step+1) * 8
		err := w.WriteEvents([]monitor.Event{
			{Tag: monitor.TrainLoss, Value: loss, X: samples},
			{Tag: monitor.LR, Value: 1e-5, X: samples},
		})
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := w.Close(); err != nil {
		fmt.Println(err)
		return
	}
	b, err := os.ReadFile(filepath.Join(dir, monitor.CSVFileName(monitor.LR)))
	if err != nil {
		fmt.Println(err)
		return
	}
	// Rows end in "\r\n", as Python's csv writer ends them.
	fmt.Println(monitor.CSVFileName(monitor.LR))
	fmt.Print(strings.ReplaceAll(string(b), "\r\n", "\n"))
	// Output:
	// Train_Samples_lr.csv
	// step,lr
	// 8,1e-05
	// 16,1e-05
}
