package plan

import (
	"io"

	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/strata-ai/strata/config"
	"github.com/strata-ai/strata/internal/durable"
)

// Profile is what `strata plan --probe` measured on one machine, kept in
// a JSON file (ProfilePath) and reused until the hardware changes: the
// rates of every part of a step the predictor adds up.
type Profile struct {
	Version int     `json:"version"`
	Machine Machine `json:"machine"`
	Created string  `json:"created"` // RFC 3339
	// CopyBytesPerS is host↔device copies (the CPU backend: a memcpy
	// between its host and device memory; CUDA: a pinned copy).
	CopyBytesPerS float64 `json:"copy_bytes_per_s"`
	// AdamParamsPerS is cpuadam's fp32-moment AdamW step with AdamThreads
	// threads (the engine's default: every core).
	AdamParamsPerS float64 `json:"adam_params_per_s"`
	AdamThreads    int     `json:"adam_threads"`
	// AdamStates are the same step with narrower optimizer state (int8
	// moments, a bf16+remainder master), same threads.
	AdamStates []AdamState `json:"adam_states,omitempty"`
	// Disks are the NVMe paths measured: sequential read and write at
	// the engine's request size (aio.block_size) and queue depth.
	Disks []Disk `json:"disks,omitempty"`
	// Decodes are the devices' decoding of a coded frozen base (nf4,
	// int8) to bf16, per format.
	Decodes []Decode `json:"decodes,omitempty"`
	// Computes are the models measured: a resident step's forward and
	// backward and its device Adam, at one batch, sequence and device
	// count each.
	Computes []Compute `json:"computes,omitempty"`
}

// ProfileVersion is the format of Profile.
const ProfileVersion = 1

// Machine identifies the hardware a profile was measured on.
type Machine struct {
	CPU      string `json:"cpu"`       // /proc/cpuinfo's model name
	CPUs     int    `json:"cpus"`      // logical CPUs of the machine
	RAMBytes int64  `json:"ram_bytes"` // MemTotal
	Backend  string `json:"backend"`   // "cpu" or "cuda"
	Device   string `json:"device"`    // the backend's description of its devices
}

// Disk is one NVMe path's measured sequential rates.
type Disk struct {
	Path           string  `json:"path"`
	ReadBytesPerS  float64 `json:"read_bytes_per_s"`
	WriteBytesPerS float64 `json:"write_bytes_per_s"`
	// MixedBytesPerS is reads and writes at once (every other block
	// written while its neighbours are read), both directions counted:
	// what a step that reads the optimizer state while it writes the
	// last update's gets.
	MixedBytesPerS float64 `json:"mixed_bytes_per_s"`
	BlockBytes     int64   `json:"block_bytes"`
}

// Compute is one model's measured step on the devices: FwdBwdSeconds is a
// resident step's time without its optimizer phase, DeviceAdamSeconds the
// optimizer phase (Adam on the devices), both medians over the measured
// steps.
type Compute struct {
	Model string `json:"model"`
	// Job is the LoRA job the step trained ("lora r=16 targets=q_proj,v_proj",
	// its base bf16 on the devices); "" a full fine-tune.
	Job               string  `json:"job,omitempty"`
	Devices           int     `json:"devices"`
	Batch             int     `json:"batch"`
	Seq               int     `json:"seq"`
	Params            int64   `json:"params"`
	FwdBwdSeconds     float64 `json:"fwd_bwd_s"`
	DeviceAdamSeconds float64 `json:"device_adam_s"`
	// OffloadStepSeconds is the median step of the same model with the
	// optimizer state in host RAM (ZeRO-Offload, stage OffloadStage): what
	// the host path costs beyond CPU Adam and the copies (leases, pinned
	// staging, the gradient's conversions) is calibrated from it; 0 when
	// not measured (no offloaded placement fits).
	OffloadStepSeconds float64 `json:"offload_step_s,omitempty"`
	OffloadStage       int     `json:"offload_stage,omitempty"`
	// CheckpointFwdBwdSeconds is FwdBwdSeconds of the same placement with
	// activation checkpointing (every block's forward run again in the
	// backward); 0 when not measured.
	CheckpointFwdBwdSeconds float64 `json:"checkpoint_fwd_bwd_s,omitempty"`
	// HostParamsStepSeconds is the median step of the job with params and
	// optimizer state in host RAM at stage 3 (HostParamsMoments and
	// HostParamsMaster its optimizer state: its first such placement that
	// fits): what offloaded params cost beyond their copies is calibrated
	// from it; 0 when not measured.
	HostParamsStepSeconds float64 `json:"host_params_step_s,omitempty"`
	HostParamsMoments     string  `json:"host_params_moments,omitempty"`
	HostParamsMaster      string  `json:"host_params_master,omitempty"`
	// NVMeEfficiency is the share of the drive's probed rates (Disk) the
	// engine's moves got in a measured step of the job's first NVMe
	// placement that fits: what the probe's rates predict for the step's
	// NVMe bytes over the time the engine's NVMe links were busy
	// (ProbeNVMe); 0 when not measured.
	NVMeEfficiency float64 `json:"nvme_efficiency,omitempty"`
	// NVMePath is the path NVMeEfficiency was measured on.
	NVMePath string `json:"nvme_path,omitempty"`
	// NVMeKeptReadBytes and NVMeKeptWriteBytes are the bytes a step of
	// the same placement would read and write on NVMe (diskBytes) that the
	// tier store kept in its host room instead, as those steps measured
	// them; NarrowKeptReadBytes and NarrowKeptWriteBytes the same of the
	// job's narrow-state NVMe placement. The store keeps optimizer state
	// between steps in the staging room sized for the largest chunk's fp32
	// state, which holds much of a narrow state (gpt2-774m's int8 state
	// moved 0.34-0.70 GB of its 3.2 GB a step) and little of an fp32 one.
	// 0 when not measured.
	NVMeKeptReadBytes    float64 `json:"nvme_kept_read_bytes,omitempty"`
	NVMeKeptWriteBytes   float64 `json:"nvme_kept_write_bytes,omitempty"`
	NarrowKeptReadBytes  float64 `json:"narrow_nvme_kept_read_bytes,omitempty"`
	NarrowKeptWriteBytes float64 `json:"narrow_nvme_kept_write_bytes,omitempty"`
}

// Decode is the devices' rate of decoding one stored format of a frozen
// base (gpu.Ops.Dequantize) to bf16.
type Decode struct {
	Format     string  `json:"format"` // strata.lora.base_dtype's name
	ParamsPerS float64 `json:"params_per_s"`
}

// DecodeRate is the measured rate of decoding format (0: not measured).
func (p *Profile) DecodeRate(format string) float64 {
	for _, d := range p.Decodes {
		if d.Format == format {
			return d.ParamsPerS
		}
	}
	return 0
}

// SetDecodeRate adds or replaces a format's decoding rate.
func (p *Profile) SetDecodeRate(d Decode) {
	p.Decodes = upsert(p.Decodes, d, func(o Decode) bool { return o.Format == d.Format })
}

// AdamState is cpuadam's rate with one optimizer state's precision
// (strata.optimizer_state's names).
type AdamState struct {
	Moments    string  `json:"moments"`
	Master     string  `json:"master"`
	ParamsPerS float64 `json:"params_per_s"`
}

// AdamRate is cpuadam's params/s with moments and master (0 when not
// measured; fp32 both: AdamParamsPerS).
func (p *Profile) AdamRate(moments, master string) float64 {
	if moments == "fp32" && master == "fp32" {
		return p.AdamParamsPerS
	}
	for _, a := range p.AdamStates {
		if a.Moments == moments && a.Master == master {
			return a.ParamsPerS
		}
	}
	return 0
}

// hasRates says whether p holds every rate ProbeRates measures: the
// copies, CPU Adam with each optimizer state, the decoding of each coded
// base.
func (p *Profile) hasRates() bool {
	if p.CopyBytesPerS == 0 {
		return false
	}
	for _, mo := range []string{config.MomentsFP32, config.MomentsBF16, config.MomentsInt8} {
		for _, ma := range []string{config.MasterFP32, config.MasterBF16Remainder} {
			if p.AdamRate(mo, ma) == 0 {
				return false
			}
		}
	}
	for _, f := range config.BaseDTypes[1:] {
		if p.DecodeRate(f) == 0 {
			return false
		}
	}
	return true
}

// SetAdamRate adds or replaces a narrow state's rate.
func (p *Profile) SetAdamRate(a AdamState) {
	p.AdamStates = upsert(p.AdamStates, a, func(o AdamState) bool { return o.Moments == a.Moments && o.Master == a.Master })
}

// Compute returns the measured step of a model's job (a full fine-tune,
// or LoRA of its rank and targets, whatever its base's stored format) at
// devices, batch and seq (false when the profile has none).
func (p *Profile) Compute(model string, job Job, devices, batch, seq int) (Compute, bool) {
	for _, c := range p.Computes {
		if c.Model == model && c.Job == job.computeKey() && c.Devices == devices && c.Batch == batch && c.Seq == seq {
			return c, true
		}
	}
	return Compute{}, false
}

// SetCompute adds or replaces c.
func (p *Profile) SetCompute(c Compute) {
	p.Computes = upsert(p.Computes, c, func(o Compute) bool {
		return o.Model == c.Model && o.Job == c.Job && o.Devices == c.Devices && o.Batch == c.Batch && o.Seq == c.Seq
	})
}

// Disk returns the measured rates of path (false when not measured).
func (p *Profile) Disk(path string) (Disk, bool) {
	for _, d := range p.Disks {
		if d.Path == path {
			return d, true
		}
	}
	return Disk{}, false
}

// SetDisk adds or replaces d.
func (p *Profile) SetDisk(d Disk) {
	p.Disks = upsert(p.Disks, d, func(o Disk) bool { return o.Path == d.Path })
}

// upsert replaces the first element of s that is the same as v (same),
// or appends v.
func upsert[T any](s []T, v T, same func(T) bool) []T {
	if i := slices.IndexFunc(s, same); i >= 0 {
		s[i] = v
		return s
	}
	return append(s, v)
}

// ErrOtherMachine is a profile measured on other hardware.
var ErrOtherMachine = errors.New("the profile was measured on another machine")

// Check says whether p can serve machine m: the same CPU, CPU count, RAM
// (within 5 %: the kernel's reservations move) and devices.
func (p *Profile) Check(m Machine) error {
	a := p.Machine
	ram := float64(a.RAMBytes) / float64(max(m.RAMBytes, 1))
	if p.Version != ProfileVersion {
		return fmt.Errorf("plan: profile format %d, this strata reads %d: measure again (--probe)", p.Version, ProfileVersion)
	}
	if a.CPU != m.CPU || a.CPUs != m.CPUs || ram < 0.95 || ram > 1.05 || a.Backend != m.Backend || a.Device != m.Device {
		return fmt.Errorf("plan: %w (%s, %d CPUs, %d MiB RAM, %s %s; this one: %s, %d CPUs, %d MiB RAM, %s %s): measure this one (--probe)",
			ErrOtherMachine, a.CPU, a.CPUs, a.RAMBytes>>20, a.Backend, a.Device, m.CPU, m.CPUs, m.RAMBytes>>20, m.Backend, m.Device)
	}
	return nil
}

// ThisMachine is the fingerprint of the machine the process runs on, with
// the backend's name and its description of the devices.
func ThisMachine(backend, device string) Machine {
	m := Machine{CPUs: runtime.NumCPU(), Backend: backend, Device: device}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var kb int64
			if n, _ := fmt.Sscanf(sc.Text(), "MemTotal: %d kB", &kb); n == 1 {
				m.RAMBytes = kb << 10
				break
			}
		}
		f.Close()
	}
	return m
}

// ProfileEnv is the environment variable that names the profile file,
// for every command that reads or writes it (strata plan, strata train)
// when no --profile is given.
const ProfileEnv = "STRATA_PROFILE"

// DefaultPath is where the profile lives when no --profile names it:
// $STRATA_PROFILE, else $XDG_CONFIG_HOME/strata (~/.config/strata),
// profile.json.
func DefaultPath() (string, error) {
	path, _, err := ProfilePath("")
	return path, err
}

// ProfilePath is the profile file a command uses: flag (its --profile)
// when given, else $STRATA_PROFILE, else the file in the user's config
// directory; from says which one it is ("--profile", "STRATA_PROFILE" or
// "the default"), for messages that name where a command looked.
func ProfilePath(flag string) (path, from string, err error) {
	if flag != "" {
		return flag, "--profile", nil
	}
	if env := os.Getenv(ProfileEnv); env != "" {
		return env, ProfileEnv, nil
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", "the default", fmt.Errorf("plan: no config directory for the profile (%v): give --profile FILE or set %s", err, ProfileEnv)
	}
	return filepath.Join(dir, "strata", "profile.json"), "the default", nil
}

// Load reads a profile; a missing file is os.ErrNotExist (wrapped). A file
// that does not decode, or whose figures no measurement gives (Validate),
// is refused naming the file and the key, with the way to measure again.
func Load(path string) (*Profile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("plan: profile: %w", err)
	}
	var p Profile
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("plan: profile %s: %v; %s", path, err, remeasure)
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("plan: profile %s: %v; %s", path, err, remeasure)
	}
	return &p, nil
}

// remeasure is how a refused profile is replaced.
const remeasure = "measure this machine again with strata plan --probe (it rewrites the file), or delete the file"

// The bounds of a measured figure: what no machine Strata runs on comes
// near, by orders of magnitude (HBM is a few TB/s, a CPU's Adam 10^10
// params/s at most, a step no faster than a nanosecond nor slower than
// 10^6 s); beyond them a figure is a typo or a corrupt file, and ranking
// placements by it would be ranking noise.
const (
	maxBytesPerS  = 1e15 // 1 PB/s
	maxParamsPerS = 1e14
	minSeconds    = 1e-9
	maxSeconds    = 1e6
)

// Validate says what is wrong with p's figures: every rate and time
// finite, not negative, and within what a measurement gives (above 0 and
// under maxBytesPerS, maxParamsPerS; times from minSeconds to
// maxSeconds). A top-level figure or an optional one may be 0 (not
// measured: plan measures it); the figures of an entry of disks,
// computes or adam_states are what the entry is, and must be measured.
func (p *Profile) Validate() error {
	type check struct {
		key      string
		v        float64
		lo, hi   float64 // the smallest (0: any above 0) and largest measured values
		optional bool    // 0 means not measured
		unit     string
	}
	checks := []check{
		{"copy_bytes_per_s", p.CopyBytesPerS, 0, maxBytesPerS, true, "bytes/s"},
		{"adam_params_per_s", p.AdamParamsPerS, 0, maxParamsPerS, true, "params/s"},
	}
	for i, a := range p.AdamStates {
		checks = append(checks, check{fmt.Sprintf("adam_states[%d].params_per_s", i), a.ParamsPerS, 0, maxParamsPerS, false, "params/s"})
	}
	for i, d := range p.Decodes {
		checks = append(checks, check{fmt.Sprintf("decodes[%d].params_per_s", i), d.ParamsPerS, 0, maxParamsPerS, false, "params/s"})
	}
	for i, d := range p.Disks {
		k := fmt.Sprintf("disks[%d]", i)
		checks = append(checks,
			check{k + ".read_bytes_per_s", d.ReadBytesPerS, 0, maxBytesPerS, false, "bytes/s"},
			check{k + ".write_bytes_per_s", d.WriteBytesPerS, 0, maxBytesPerS, false, "bytes/s"},
			check{k + ".mixed_bytes_per_s", d.MixedBytesPerS, 0, maxBytesPerS, true, "bytes/s"})
	}
	for i, c := range p.Computes {
		k := fmt.Sprintf("computes[%d]", i)
		checks = append(checks,
			check{k + ".fwd_bwd_s", c.FwdBwdSeconds, minSeconds, maxSeconds, false, "s"},
			check{k + ".device_adam_s", c.DeviceAdamSeconds, minSeconds, maxSeconds, true, "s"},
			check{k + ".offload_step_s", c.OffloadStepSeconds, minSeconds, maxSeconds, true, "s"},
			check{k + ".checkpoint_fwd_bwd_s", c.CheckpointFwdBwdSeconds, minSeconds, maxSeconds, true, "s"},
			check{k + ".nvme_efficiency", c.NVMeEfficiency, 1e-3, 1e3, true, ""},
			check{k + ".nvme_kept_read_bytes", c.NVMeKeptReadBytes, 0, 1e15, true, "bytes"},
			check{k + ".nvme_kept_write_bytes", c.NVMeKeptWriteBytes, 0, 1e15, true, "bytes"},
			check{k + ".narrow_nvme_kept_read_bytes", c.NarrowKeptReadBytes, 0, 1e15, true, "bytes"},
			check{k + ".narrow_nvme_kept_write_bytes", c.NarrowKeptWriteBytes, 0, 1e15, true, "bytes"},
			check{k + ".host_params_step_s", c.HostParamsStepSeconds, minSeconds, maxSeconds, true, "s"})
	}
	for _, c := range checks {
		switch {
		case c.v == 0 && c.optional:
		case !(c.v > 0 && c.v >= c.lo && c.v <= c.hi): // NaN too
			want := fmt.Sprintf("above 0 and at most %g %s", c.hi, c.unit)
			if c.lo > 0 {
				want = fmt.Sprintf("from %g to %g %s", c.lo, c.hi, c.unit)
			}
			return fmt.Errorf("%s %g is not a measured figure (want %s)", c.key, c.v, want)
		}
	}
	for i, c := range p.Computes {
		if c.Devices < 1 || c.Batch < 1 || c.Seq < 1 || c.Params < 0 {
			return fmt.Errorf("computes[%d]: devices %d, batch %d and seq %d must be at least 1, params %d not negative", i, c.Devices, c.Batch, c.Seq, c.Params)
		}
	}
	if p.AdamThreads < 0 {
		return fmt.Errorf("adam_threads %d is negative", p.AdamThreads)
	}
	return nil
}

// Save writes p to path (its directory created), replacing the file
// whole and crash-safe (internal/durable).
func (p *Profile) Save(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("plan: profile: %w", err)
	}
	b, _ := json.MarshalIndent(p, "", "  ")
	err := durable.WriteFile(path, 0, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
	if err != nil {
		return fmt.Errorf("plan: profile: %w", err)
	}
	return nil
}

// NewProfile is an empty profile of machine m, stamped now.
func NewProfile(m Machine) *Profile {
	return &Profile{Version: ProfileVersion, Machine: m, Created: time.Now().UTC().Format(time.RFC3339)}
}
