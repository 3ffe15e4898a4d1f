package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/strata-ai/strata/internal/units"
	"golang.org/x/sys/unix"
)

// blockDev is one block device holding a bench file, as sysfs shows it.
type blockDev struct {
	name         string // sysfs name: vda, nvme0n1p2, dm-0
	dir          string // /sys/dev/block/MAJ:MIN, resolved
	maxSegments  int64  // queue/max_segments: 0 when unknown
	maxSectorsKB int64  // queue/max_sectors_kb: 0 when unknown
	before       []uint64
}

// blockStats takes /sys/dev/block/MAJ:MIN/stat before and after a run.
type blockStats struct {
	devs []*blockDev
	note string // why there are no figures
}

// startBlockStats finds the devices holding the files and reads their
// counters.
func startBlockStats(files []benchFile) *blockStats {
	s := &blockStats{}
	for _, f := range files {
		var st unix.Stat_t
		if err := unix.Fstat(f.f.Fd(), &st); err != nil {
			s.note = fmt.Sprintf("no block-layer figures: stat %s: %v", f.path, err)
			return s
		}
		link := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
		dir, err := filepath.EvalSymlinks(link)
		if err != nil {
			s.note = fmt.Sprintf("no block-layer figures: %s has no block device (%s: %v)", f.path, link, err)
			return s
		}
		if slices.ContainsFunc(s.devs, func(d *blockDev) bool { return d.dir == dir }) {
			continue
		}
		d := &blockDev{name: filepath.Base(dir), dir: dir}
		queue := filepath.Join(dir, "queue")
		if _, err := os.Stat(filepath.Join(dir, "partition")); err == nil {
			queue = filepath.Join(filepath.Dir(dir), "queue") // a partition: the disk's queue
		}
		d.maxSegments = readSysInt(filepath.Join(queue, "max_segments"))
		d.maxSectorsKB = readSysInt(filepath.Join(queue, "max_sectors_kb"))
		if d.before, err = readBlockStat(dir); err != nil {
			s.note = "no block-layer figures: " + err.Error()
			return s
		}
		s.devs = append(s.devs, d)
	}
	return s
}

// stop reads the counters again and fills res's block figures for the
// run's direction: requests, their average size, and a warning when they
// were split below the block size.
func (s *blockStats) stop(res *NVMeResult, opts NVMeOptions, hugeBuffers bool) {
	if s.note != "" {
		res.BlockNote = s.note
		return
	}
	var reqs, sectors uint64
	var names []string
	for _, d := range s.devs {
		after, err := readBlockStat(d.dir)
		if err != nil {
			res.BlockNote = "no block-layer figures: " + err.Error()
			return
		}
		names = append(names, d.name)
		// Fields: read ios, merges, sectors, ticks; write ios, merges, sectors, ticks.
		if opts.RW != "write" && opts.RW != "randwrite" {
			reqs += after[0] - d.before[0]
			sectors += after[2] - d.before[2]
		}
		if opts.RW != "read" && opts.RW != "randread" {
			reqs += after[4] - d.before[4]
			sectors += after[6] - d.before[6]
		}
	}
	res.BlockDevices = strings.Join(names, ",")
	res.BlockRequests = int64(reqs)
	if reqs == 0 {
		res.BlockNote = "no block requests reached " + res.BlockDevices + " (page cache, or a filesystem without a block device)"
		return
	}
	res.BlockAvgBytes = int64(sectors * 512 / reqs)
	res.BlockNote = splitNote(res, s.devs, hugeBuffers)
}

// splitNote warns when the average request is below the block size (5 %
// slack for other I/O to the device), with the likely cause.
func splitNote(res *NVMeResult, devs []*blockDev, hugeBuffers bool) string {
	if res.BlockAvgBytes*100 >= res.BlockBytes*95 {
		return ""
	}
	msg := fmt.Sprintf("requests split: %d requests of %s on average for %s blocks",
		res.BlockRequests, units.FormatBytes(res.BlockAvgBytes), units.FormatBytes(res.BlockBytes))
	for _, d := range devs {
		switch {
		case d.maxSectorsKB > 0 && d.maxSectorsKB<<10 < res.BlockBytes:
			return msg + fmt.Sprintf(": %s takes at most max_sectors_kb %d per request; a smaller --bs (the aio block_size) avoids the split",
				d.name, d.maxSectorsKB)
		case !hugeBuffers && d.maxSegments > 0 && d.maxSegments*4096 < res.BlockBytes:
			return msg + fmt.Sprintf(": the buffers are in 4 KiB pages (see buffers) and a block needs %d segments, more than %s's max_segments %d",
				res.BlockBytes/4096, d.name, d.maxSegments)
		}
	}
	return msg + " (other I/O on the device, or the file's extents are not contiguous)"
}

func readBlockStat(dir string) ([]uint64, error) {
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return nil, err
	}
	f := strings.Fields(string(b))
	if len(f) < 8 {
		return nil, fmt.Errorf("%s/stat: %d fields, want at least 8", dir, len(f))
	}
	v := make([]uint64, 8)
	for i := range v {
		if v[i], err = strconv.ParseUint(f[i], 10, 64); err != nil {
			return nil, fmt.Errorf("%s/stat: field %d: %w", dir, i+1, err)
		}
	}
	return v, nil
}

func readSysInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v
}
