// Exercises pgjdbc against a server (directly or through the IMP proxy) and prints a
// deterministic transcript; tests/imp_proxy/test_jdbc.py compares the two transcripts.
// Usage: java -cp postgresql.jar:. JdbcCheck <jdbc-url> basic|concurrent|cancel|probe|repeat
import java.math.BigDecimal;
import java.sql.*;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.AtomicInteger;

public class JdbcCheck {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        switch (args[1]) {
            case "basic": basic(url); break;
            case "concurrent": concurrent(url, Integer.parseInt(args[2])); break;
            case "cancel": cancel(url); break;
            case "probe": probe(url); break;
            case "repeat": repeat(url, args[2], Integer.parseInt(args[3])); break;
            default: throw new IllegalArgumentException(args[1]);
        }
    }

    static void basic(String url) throws Exception {
        try (Connection c = DriverManager.getConnection(url)) {
            try (Statement s = c.createStatement()) {
                s.execute("CREATE TEMP TABLE j (id int PRIMARY KEY, name text, amount numeric(12,3),"
                        + " at timestamp, flag boolean, f float8)");
                try (ResultSet rs = s.executeQuery("SELECT current_setting('extra_float_digits'),"
                        + " 0.1::float8, 1e100::float8, 'x'::text")) {
                    rs.next();
                    System.out.println("settings " + rs.getString(1) + " " + rs.getDouble(2) + " "
                            + rs.getString(3) + " " + rs.getString(4));
                }
            }
            // batch insert through a PreparedStatement with parameters of several types
            try (PreparedStatement ps = c.prepareStatement(
                    "INSERT INTO j VALUES (?, ?, ?, ?, ?, ?)")) {
                for (int i = 1; i <= 200; i++) {
                    ps.setInt(1, i);
                    if (i % 17 == 0) ps.setNull(2, Types.VARCHAR); else ps.setString(2, "name-" + i);
                    ps.setBigDecimal(3, new BigDecimal(i).divide(new BigDecimal(8)));
                    ps.setTimestamp(4, Timestamp.valueOf("2024-02-03 04:05:06.789"));
                    ps.setBoolean(5, i % 2 == 0);
                    ps.setDouble(6, i / 3.0);
                    ps.addBatch();
                }
                int[] counts = ps.executeBatch();
                System.out.println("batch " + counts.length + " " + Arrays.stream(counts).sum());
            }
            // server-prepared statement reuse (prepareThreshold in the URL)
            try (PreparedStatement ps = c.prepareStatement(
                    "SELECT id, name, amount, at, flag, f FROM j WHERE id BETWEEN ? AND ? ORDER BY id")) {
                for (int k = 0; k < 6; k++) {
                    ps.setInt(1, k * 10 + 1);
                    ps.setLong(2, k * 10 + 3);
                    try (ResultSet rs = ps.executeQuery()) {
                        StringBuilder sb = new StringBuilder("select " + k + ":");
                        while (rs.next()) {
                            sb.append(" [").append(rs.getInt(1)).append(',').append(rs.getString(2))
                              .append(',').append(rs.getBigDecimal(3)).append(',')
                              .append(rs.getTimestamp(4)).append(',').append(rs.getBoolean(5))
                              .append(',').append(rs.getDouble(6)).append(']');
                        }
                        System.out.println(sb);
                    }
                }
            }
            // transactions: rollback discards, commit keeps
            c.setAutoCommit(false);
            try (Statement s = c.createStatement()) {
                s.executeUpdate("DELETE FROM j WHERE id > 100");
                c.rollback();
                System.out.println("after rollback " + count(c));
                s.executeUpdate("DELETE FROM j WHERE id > 150");
                c.commit();
                System.out.println("after commit " + count(c));
                try {
                    s.execute("SELECT * FROM no_such_table");
                } catch (SQLException e) {
                    System.out.println("error " + e.getSQLState());
                }
                try {
                    s.execute("SELECT 1");
                } catch (SQLException e) {
                    System.out.println("aborted " + e.getSQLState());
                }
                c.rollback();
            }
            // cursor-based fetching: setFetchSize with autocommit off (portal + Execute max_rows)
            try (PreparedStatement ps = c.prepareStatement(
                    "SELECT g, md5(g::text) FROM generate_series(1, ?) g")) {
                ps.setFetchSize(25);
                ps.setInt(1, 1000);
                long sum = 0; int rows = 0; String last = null;
                try (ResultSet rs = ps.executeQuery()) {
                    while (rs.next()) { sum += rs.getInt(1); rows++; last = rs.getString(2); }
                }
                System.out.println("fetch " + rows + " " + sum + " " + last);
            }
            c.commit();
            c.setAutoCommit(true);
            try (Statement s = c.createStatement()) {
                boolean more = s.execute("SELECT 1 AS a; SELECT 'two' AS b; UPDATE j SET flag = true WHERE id < 5");
                StringBuilder sb = new StringBuilder("multi");
                while (true) {
                    if (more) {
                        try (ResultSet rs = s.getResultSet()) { rs.next(); sb.append(' ').append(rs.getString(1)); }
                    } else {
                        int n = s.getUpdateCount();
                        if (n == -1) break;
                        sb.append(" upd=").append(n);
                    }
                    more = s.getMoreResults();
                }
                System.out.println(sb);
            }
            DatabaseMetaData md = c.getMetaData();
            System.out.println("meta " + md.getDatabaseProductName() + " " + md.getDatabaseMajorVersion());
        }
    }

    // a parameterised GROUP BY query that the test hook of tests/imp_proxy/hooks.py sketches
    static void probe(String url) throws Exception {
        try (Connection c = DriverManager.getConnection(url);
             PreparedStatement ps = c.prepareStatement("SELECT grp, count(*) AS n, max(id) AS m"
                     + " FROM probe WHERE id >= ? AND grp = ? GROUP BY grp ORDER BY grp")) {
            for (int k = 0; k < 6; k++) {
                ps.setLong(1, k * 10L);
                ps.setInt(2, k % 3);
                try (ResultSet rs = ps.executeQuery()) {
                    StringBuilder sb = new StringBuilder("probe " + k + ":");
                    while (rs.next()) {
                        sb.append(' ').append(rs.getInt(1)).append('/').append(rs.getLong(2))
                          .append('/').append(rs.getLong(3));
                    }
                    System.out.println(sb);
                }
            }
        }
    }

    // Runs one query n times as a PreparedStatement (server-prepared after prepareThreshold)
    // and prints each result as text; also the session's TimeZone, which pgjdbc sets from the
    // JVM's.
    static void repeat(String url, String sql, int n) throws Exception {
        try (Connection c = DriverManager.getConnection(url);
             PreparedStatement ps = c.prepareStatement(sql)) {
            try (Statement s = c.createStatement();
                 ResultSet rs = s.executeQuery("SELECT current_setting('TimeZone')")) {
                rs.next();
                System.out.println("timezone " + rs.getString(1));
            }
            for (int k = 0; k < n; k++) {
                try (ResultSet rs = ps.executeQuery()) {
                    StringBuilder sb = new StringBuilder("run " + k + ":");
                    int cols = rs.getMetaData().getColumnCount();
                    while (rs.next()) {
                        sb.append(" (");
                        for (int i = 1; i <= cols; i++) {
                            sb.append(i > 1 ? "," : "").append(rs.getString(i));
                        }
                        sb.append(')');
                    }
                    System.out.println(sb);
                }
            }
        }
    }

    static int count(Connection c) throws SQLException {
        try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SELECT count(*) FROM j")) {
            rs.next();
            return rs.getInt(1);
        }
    }

    static void concurrent(String url, int clients) throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(clients);
        AtomicInteger ok = new AtomicInteger();
        List<Future<?>> fs = new ArrayList<>();
        CountDownLatch allConnected = new CountDownLatch(clients);
        for (int t = 0; t < clients; t++) {
            final int id = t;
            fs.add(pool.submit(() -> {
                try (Connection c = DriverManager.getConnection(url)) {
                    allConnected.countDown();
                    allConnected.await(60, TimeUnit.SECONDS);
                    try (PreparedStatement ps = c.prepareStatement("SELECT ?::int * 2, pg_backend_pid()")) {
                        for (int i = 0; i < 30; i++) {
                            ps.setInt(1, id * 1000 + i);
                            try (ResultSet rs = ps.executeQuery()) {
                                rs.next();
                                if (rs.getInt(1) != 2 * (id * 1000 + i)) throw new IllegalStateException("wrong");
                            }
                        }
                    }
                    ok.incrementAndGet();
                }
                return null;
            }));
        }
        for (Future<?> f : fs) f.get(120, TimeUnit.SECONDS);
        pool.shutdown();
        System.out.println("concurrent ok " + ok.get());
    }

    static void cancel(String url) throws Exception {
        try (Connection c = DriverManager.getConnection(url); Statement s = c.createStatement()) {
            ScheduledExecutorService ex = Executors.newSingleThreadScheduledExecutor();
            ex.schedule(() -> { try { s.cancel(); } catch (SQLException e) { throw new RuntimeException(e); } },
                    700, TimeUnit.MILLISECONDS);
            long t0 = System.nanoTime();
            try {
                s.execute("SELECT pg_sleep(30)");
                System.out.println("not cancelled");
            } catch (SQLException e) {
                long ms = (System.nanoTime() - t0) / 1_000_000;
                System.out.println("cancelled " + e.getSQLState() + " fast=" + (ms < 10000));
            }
            ex.shutdown();
            try (ResultSet rs = s.executeQuery("SELECT 'usable'")) {
                rs.next();
                System.out.println("after cancel " + rs.getString(1));
            }
        }
    }
}
