package distributed

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

var routeOnce sync.Once

// RouteClientLogs sends go-redis's own log lines (one "failed to dial" per
// connection attempt during an outage) to logger at DEBUG level instead of
// stderr: the store already logs each outage and recovery once, and an
// operator's log must not grow by a line a second while Redis is down.
// go-redis has one logger per process, so the first call wins.
func RouteClientLogs(logger *zap.Logger) {
	routeOnce.Do(func() { redis.SetLogger(clientLog{logger.WithOptions(zap.AddCallerSkip(1))}) })
}

type clientLog struct{ l *zap.Logger }

func (c clientLog) Printf(_ context.Context, format string, v ...any) {
	if ce := c.l.Check(zap.DebugLevel, "go-redis"); ce != nil {
		ce.Write(zap.String("detail", fmt.Sprintf(format, v...)))
	}
}
