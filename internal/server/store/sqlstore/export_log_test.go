package sqlstore

// Queries whose plans the tests examine.
const (
	LogExtentSQL      = logExtentSQL
	LogExtentAfterSQL = logExtentAfterSQL
	LogDataSQL        = logDataSQL
	LogSummarySQL     = logSummarySQL
)
