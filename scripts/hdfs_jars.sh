#!/usr/bin/env bash
# The jars of a real single-node HDFS for tests (Hadoop's MiniDFSCluster, from
# org.apache.hadoop:hadoop-client-minicluster at the version of PySpark's Hadoop client),
# fetched once from Maven Central into .cache/hdfs/lib. Idempotent; prints the lib folder.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-$ROOT/.venv/bin/python}
# The Hadoop version PySpark's own client jars carry (hadoop-client-api-<v>.jar).
VERSION=$("$PY" -c "import glob, os, pyspark, re; [j] = glob.glob(os.path.join(os.path.dirname(pyspark.__file__), 'jars', 'hadoop-client-api-*.jar')); print(re.search(r'api-(.+)\.jar', j).group(1))")
DIR=${HDFS_JARS_DIR:-$ROOT/.cache/hdfs}
LIB="$DIR/lib-$VERSION"
mkdir -p "$DIR"
# One download at a time (parallel test workers may each ask): the others wait, then find it done.
exec 9>"$DIR/.lock"
flock 9
if [ ! -f "$LIB/.complete" ]; then
  echo "hdfs_jars: fetching hadoop-client-minicluster $VERSION from Maven Central into $LIB" >&2
  rm -rf "$LIB" "$DIR/pom"
  mkdir -p "$DIR/pom"
  cat > "$DIR/pom/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>sparkdeep</groupId><artifactId>hdfs-minicluster</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-client-minicluster</artifactId>
      <version>$VERSION</version></dependency>
  </dependencies>
</project>
POM
  mvn -q -B -f "$DIR/pom/pom.xml" dependency:copy-dependencies -DoutputDirectory="$LIB" >&2
  touch "$LIB/.complete"
fi
echo "$LIB"
