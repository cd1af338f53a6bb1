package actors

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// etcdLogger routes the etcd client's zap logs (JSON on stderr at Info by
// default) to our logger, at Warn and above, tagged lib=etcd.
func etcdLogger(log *slog.Logger) *zap.Logger {
	return zap.New(zapSlog{log: log.With("lib", "etcd")})
}

// zapSlog is a zapcore.Core that writes to slog.
type zapSlog struct {
	log    *slog.Logger
	fields []zapcore.Field
}

func (z zapSlog) Enabled(l zapcore.Level) bool { return l >= zapcore.WarnLevel }

func (z zapSlog) With(fields []zapcore.Field) zapcore.Core {
	return zapSlog{log: z.log, fields: append(append([]zapcore.Field{}, z.fields...), fields...)}
}

func (z zapSlog) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if z.Enabled(e.Level) {
		return ce.AddCore(e, z)
	}
	return ce
}

func (z zapSlog) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range z.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	attrs := make([]any, 0, 2*len(enc.Fields))
	for k, v := range enc.Fields {
		attrs = append(attrs, k, v)
	}
	level := slog.LevelWarn
	if e.Level >= zapcore.ErrorLevel {
		level = slog.LevelError
	}
	z.log.Log(context.Background(), level, e.Message, attrs...)
	return nil
}

func (z zapSlog) Sync() error { return nil }
