package rankscopemergeprocessor

import (
	"errors"
	"regexp"
	"strings"
	"time"
)

// Config of the merge processor (the `rankscopemerge` key of a Collector config).
type Config struct {
	// Interval is the merge window. States that arrive within one window merge into one state
	// per (experiment, attempt, step, key); a request is answered when its window is forwarded,
	// so nothing is acknowledged that the next stage has not taken.
	Interval time.Duration `mapstructure:"interval"`
	// PerRankKeys are key patterns (`*` any run of characters, `?` one) forwarded unmerged,
	// so the sink can still write per-process series of them.
	PerRankKeys []string `mapstructure:"per_rank_keys"`
	// MaxPoints forwards a window early once it holds this many points (merged states plus
	// points passed through), bounding the memory one window takes.
	MaxPoints int `mapstructure:"max_points"`
}

func createDefaultConfig() *Config {
	return &Config{Interval: 200 * time.Millisecond, MaxPoints: 200_000}
}

// Validate reports a config the processor cannot run with.
func (c *Config) Validate() error {
	var errs []error
	if c.Interval <= 0 || c.Interval > time.Minute {
		errs = append(errs, errors.New("interval must be in (0, 1m]"))
	}
	if c.MaxPoints < 1 {
		errs = append(errs, errors.New("max_points must be at least 1"))
	}
	for _, p := range c.PerRankKeys {
		if p == "" {
			errs = append(errs, errors.New("per_rank_keys holds an empty pattern"))
		}
	}
	return errors.Join(errs...)
}

// keyMatcher is PerRankKeys compiled: one anchored regular expression.
func (c *Config) keyMatcher() *regexp.Regexp {
	if len(c.PerRankKeys) == 0 {
		return nil
	}
	parts := make([]string, len(c.PerRankKeys))
	for i, p := range c.PerRankKeys {
		q := regexp.QuoteMeta(p)
		q = strings.ReplaceAll(q, `\*`, `.*`)
		parts[i] = strings.ReplaceAll(q, `\?`, `.`)
	}
	return regexp.MustCompile(`^(?:` + strings.Join(parts, "|") + `)$`)
}
