package rankscopemergeprocessor

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/confmaptest"

	"github.com/rankscope/rankscope/collector/rankscopemergeprocessor/internal/metadata"
)

// The processor's config as a Collector loads it: each id's section of testdata/config.yaml
// unmarshalled over the defaults, then validated as the Collector does before it starts.
func TestLoadConfig(t *testing.T) {
	cm, err := confmaptest.LoadConf(filepath.Join("testdata", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		expected  *Config // when it loads and validates
		unmarshal string  // else the error unmarshalling gives,
		invalid   string  // or the error validating gives
	}{
		{name: "", expected: createDefaultConfig()},
		{name: "tree", expected: &Config{Interval: time.Second, PerRankKeys: []string{"*/samples", "lr?"}, MaxPoints: 50_000}},
		{name: "zero_interval", invalid: "interval must be in (0, 1m]"},
		{name: "long_interval", invalid: "interval must be in (0, 1m]"},
		{name: "no_room", invalid: "max_points must be at least 1"},
		{name: "empty_pattern", invalid: "per_rank_keys holds an empty pattern"},
		{name: "misspelled", unmarshal: "intervall"},
	}
	for _, tt := range tests {
		id := component.NewIDWithName(metadata.Type, tt.name)
		t.Run(id.String(), func(t *testing.T) {
			cfg := NewFactory().CreateDefaultConfig()
			sub, err := cm.Sub(id.String())
			if err != nil {
				t.Fatal(err)
			}
			err = sub.Unmarshal(cfg)
			if tt.unmarshal != "" {
				if err == nil || !strings.Contains(err.Error(), tt.unmarshal) {
					t.Fatalf("unmarshal gave %v, want an error naming %q", err, tt.unmarshal)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			err = confmap.Validate(cfg)
			if tt.invalid != "" {
				if err == nil || !strings.Contains(err.Error(), tt.invalid) {
					t.Fatalf("validate gave %v, want %q", err, tt.invalid)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg, tt.expected) {
				t.Fatalf("loaded %+v, want %+v", cfg, tt.expected)
			}
		})
	}
}
