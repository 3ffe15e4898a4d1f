package cuda

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// EnvKernelCache controls the on-disk cache of compiled kernels: unset or
// empty, the cache is os.UserCacheDir()/strata/kernels; "off" (or "0",
// "false") disables it; any other value is the cache folder.
const EnvKernelCache = "STRATA_KERNEL_CACHE"

// kernelCacheMagic opens every cache entry; the version digit changes when
// the entry format does.
var kernelCacheMagic = []byte("STRATAK1")

// kernelCacheHeader is magic, payload length (uint64 LE), sha256 of payload.
const kernelCacheHeader = 8 + 8 + sha256.Size

// kernelKey names a compiled module: a hash of the source, the compiler
// options, the architecture, the NVRTC version and the driver version
// (which loads the cubin), with the architecture and versions in clear for
// whoever lists the cache folder.
func kernelKey(src string, opts []string, major, minor int, nvrtcVersion string, driverVersion int) string {
	h := sha256.New()
	h.Write([]byte(src))
	h.Write([]byte{0})
	for _, o := range opts {
		h.Write([]byte(o))
		h.Write([]byte{0})
	}
	fmt.Fprintf(h, "sm_%d%d\x00nvrtc%s\x00driver%d", major, minor, nvrtcVersion, driverVersion)
	return fmt.Sprintf("%s-sm_%d%d-nvrtc%s-drv%d", hex.EncodeToString(h.Sum(nil)[:16]), major, minor, nvrtcVersion, driverVersion)
}

// kernelCache is the on-disk store of compiled modules: one file per key,
// written to a temporary file and renamed into place (readers never see a
// partial entry), each entry checked by length and sha256 when read, an
// entry that fails the check ignored and rewritten. dir "" disables it.
type kernelCache struct {
	dir string
}

// kernelCacheFromEnv returns the cache the environment asks for.
func kernelCacheFromEnv() kernelCache {
	v := strings.TrimSpace(os.Getenv(EnvKernelCache))
	switch strings.ToLower(v) {
	case "off", "0", "false", "no":
		return kernelCache{}
	case "":
		base, err := os.UserCacheDir()
		if err != nil {
			return kernelCache{} // no home: no cache, compile every start
		}
		return kernelCache{dir: filepath.Join(base, "strata", "kernels")}
	}
	return kernelCache{dir: v}
}

func (c kernelCache) path(key string) string { return filepath.Join(c.dir, key+".cubin") }

// load returns the entry for key, or false when there is none or it is
// corrupt (wrong magic, short, wrong length or checksum).
func (c kernelCache) load(key string) ([]byte, bool) {
	if c.dir == "" {
		return nil, false
	}
	b, err := os.ReadFile(c.path(key))
	if err != nil || len(b) < kernelCacheHeader || !bytes.Equal(b[:8], kernelCacheMagic) {
		return nil, false
	}
	n := binary.LittleEndian.Uint64(b[8:16])
	payload := b[kernelCacheHeader:]
	if n == 0 || uint64(len(payload)) != n {
		return nil, false
	}
	sum := sha256.Sum256(payload)
	if !bytes.Equal(sum[:], b[16:kernelCacheHeader]) {
		return nil, false
	}
	return payload, true
}

// store writes the entry for key atomically (temporary file in the same
// folder, then rename).
func (c kernelCache) store(key string, bin []byte) error {
	if c.dir == "" {
		return nil
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return fmt.Errorf("cuda: kernel cache %s: %w", c.dir, err)
	}
	f, err := os.CreateTemp(c.dir, key+".tmp*")
	if err != nil {
		return fmt.Errorf("cuda: kernel cache %s: %w", c.dir, err)
	}
	var hdr [kernelCacheHeader]byte
	copy(hdr[:8], kernelCacheMagic)
	binary.LittleEndian.PutUint64(hdr[8:16], uint64(len(bin)))
	sum := sha256.Sum256(bin)
	copy(hdr[16:], sum[:])
	_, err = f.Write(hdr[:])
	if err == nil {
		_, err = f.Write(bin)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), c.path(key))
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("cuda: kernel cache entry %s: %w", c.path(key), err)
	}
	return nil
}

// get returns the entry for key, compiling and storing it when the cache
// has none (or a corrupt one). A failed store does not fail get: the
// compiled module is returned and the error reported beside it, for the
// caller to pass on (libraries do not print).
func (c kernelCache) get(key string, compile func() ([]byte, error)) (bin []byte, hit bool, storeErr, err error) {
	if b, ok := c.load(key); ok {
		return b, true, nil, nil
	}
	b, err := compile()
	if err != nil {
		return nil, false, nil, err
	}
	if len(b) == 0 {
		return nil, false, nil, errors.New("cuda: the compiler returned an empty module for " + key)
	}
	return b, false, c.store(key, b), nil
}

var (
	// cubins compiled or loaded in this process, by kernelKey.
	cubinMu sync.Mutex
	cubins  = map[string][]byte{}

	// kernelCacheErr is the last failure to write the disk cache (the
	// backend still runs; Describe can say why starts are not warm).
	kernelCacheErr error
	// kernelCacheHits counts modules read from disk rather than compiled.
	kernelCacheHits int
)

// cubinFor returns kernels.cu compiled for sm_<major><minor>: from this
// process's memory, else the disk cache, else NVRTC (and then stored).
func cubinFor(n *nvrtcAPI, major, minor, driverVersion int) ([]byte, error) {
	return cubinForCache(kernelCacheFromEnv(), n.version(), driverVersion, major, minor, func() ([]byte, error) {
		return n.compile(kernelSource, "strata_kernels.cu", major, minor)
	})
}

// cubinForCache is cubinFor with the cache, versions and compiler given
// (tests pass a counting compile function; no GPU or NVRTC needed).
func cubinForCache(c kernelCache, nvrtcVersion string, driverVersion, major, minor int, compile func() ([]byte, error)) ([]byte, error) {
	key := kernelKey(kernelSource, nvrtcOptions(major, minor), major, minor, nvrtcVersion, driverVersion)
	cubinMu.Lock()
	defer cubinMu.Unlock()
	if b, ok := cubins[key]; ok {
		return b, nil
	}
	b, hit, storeErr, err := c.get(key, compile)
	if err != nil {
		return nil, err
	}
	if hit {
		kernelCacheHits++
	}
	if storeErr != nil {
		kernelCacheErr = storeErr
	}
	cubins[key] = b
	return b, nil
}

// kernelCacheStatus says where compiled kernels come from in this
// process: the cache folder (or that it is off), how many modules were
// read from it, and the last failure to write it.
func kernelCacheStatus() string {
	c := kernelCacheFromEnv()
	cubinMu.Lock()
	defer cubinMu.Unlock()
	s := fmt.Sprintf("kernel cache off (%s=off or no cache folder): NVRTC compiles at each start", EnvKernelCache)
	if c.dir != "" {
		s = fmt.Sprintf("kernel cache %s: %d of %d modules read from it", c.dir, kernelCacheHits, len(cubins))
	}
	if kernelCacheErr != nil {
		s += fmt.Sprintf(" (last write failed: %v)", kernelCacheErr)
	}
	return s
}
