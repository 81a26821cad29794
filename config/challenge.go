package config

import (
	"fmt"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-tally/ratelimit/zones"
)

// Challenge makes a rate zone answer a browser's navigation it would deny
// with a proof-of-work page instead of its denial. Solving it sets a cookie
// whose own identity the zone then limits under events per window, instead
// of the client's key (docs/challenges.md).
type Challenge struct {
	// The leading zero hex digits the page must find in SHA-256(challenge +
	// nonce): each digit is 16 times the work. Default: 4.
	Difficulty int `json:"difficulty,omitempty"`
	// When set (above difficulty), the difficulty rises toward it with the
	// rate of challenges issued to the same network (the zone's key), one
	// digit per 16-fold rate, and falls back when it calms.
	DifficultyMax int `json:"difficulty_max,omitempty"`
	// How long a solved challenge's cookie lasts. Default: 24h.
	Valid caddy.Duration `json:"valid,omitempty"`
	// How many requests a solved cookie's identity may make per window,
	// instead of the client's key. Required.
	MaxEvents int64 `json:"max_events,omitempty"`
	// The window of a solved cookie's budget. Required.
	Window caddy.Duration `json:"window,omitempty"`
}

// MaxDifficulty is the most leading zero digits a challenge may ask for.
const MaxDifficulty = 10

// Check fills in the defaults and refuses what cannot work, naming the fix.
func (c *Challenge) Check() error {
	if c.Difficulty == 0 {
		c.Difficulty = 4
	}
	if c.Valid == 0 {
		c.Valid = caddy.Duration(24 * time.Hour)
	}
	switch {
	case c.Difficulty < 1 || c.Difficulty > MaxDifficulty:
		return fmt.Errorf("challenge difficulty must be from 1 to %d leading zero hex digits (each is 16 times the work; 4 takes a browser about a second), not %d", MaxDifficulty, c.Difficulty)
	case c.DifficultyMax != 0 && (c.DifficultyMax < c.Difficulty || c.DifficultyMax > MaxDifficulty):
		return fmt.Errorf("challenge difficulty's upper bound must be from the lower bound (%d) to %d, not %d: difficulty 4 8", c.Difficulty, MaxDifficulty, c.DifficultyMax)
	case c.Valid < 0:
		return fmt.Errorf("challenge valid must be a positive duration, how long a solved cookie lasts: valid 24h")
	case c.MaxEvents <= 0:
		return fmt.Errorf("challenge needs the budget of a solved cookie: events 600 and window 1h in the challenge block")
	case c.Window <= 0:
		return fmt.Errorf("challenge needs the window of a solved cookie's budget: window 1h in the challenge block")
	}
	return nil
}

// unmarshalChallenge reads a zone's challenge block.
func unmarshalChallenge(d *caddyfile.Dispenser) (*Challenge, error) {
	c := new(Challenge)
	line := d.Line()
	err := Settings{
		"difficulty": func(d *caddyfile.Dispenser) (err error) {
			args := d.RemainingArgs()
			if len(args) < 1 || len(args) > 2 {
				return d.Err("challenge difficulty takes the leading zero hex digits, or a lower and an upper bound: difficulty 4, or difficulty 4 8")
			}
			if c.Difficulty, err = parseDifficulty(d, args[0]); err == nil && len(args) == 2 {
				c.DifficultyMax, err = parseDifficulty(d, args[1])
			}
			return err
		},
		"valid":  Set(&c.Valid, DurationArg),
		"events": Set(&c.MaxEvents, IntIn[int64](1, zones.MaxEvents)),
		"window": Set(&c.Window, DurationArg),
	}.Read(d, "challenge: ", "unknown challenge setting %q: expected difficulty, valid, events or window")
	if err != nil {
		return nil, err
	}
	if err := c.Check(); err != nil {
		return nil, fmt.Errorf("%v, at %s:%d", err, d.File(), line)
	}
	return c, nil
}

func parseDifficulty(d *caddyfile.Dispenser, s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > MaxDifficulty {
		return 0, d.Errf("challenge difficulty %q must be a whole number of leading zero hex digits from 1 to %d (4 takes a browser about a second): difficulty 4, or difficulty 4 8", s, MaxDifficulty)
	}
	return n, nil
}
