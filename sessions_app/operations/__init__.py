"""The operations wing: the doctor, recovery of dead processes' runs, retention, demo seeding, database checks."""
