"""The incident page: a read-only web view of each incident, served by `ruleloop serve`."""
