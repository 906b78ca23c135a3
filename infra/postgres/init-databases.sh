#!/bin/sh
# Runs once, when the postgres container initialises an empty data volume: the image creates $POSTGRES_DB
# (Prefect's database); this adds MLflow's database, owned by the same user.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<SQL
SELECT 'CREATE DATABASE "$MLFLOW_DB" OWNER "$POSTGRES_USER"'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$MLFLOW_DB')\gexec
SQL
