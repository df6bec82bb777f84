"""Pure folds from events to views, and the runtime that feeds them from a stream."""
